package ec2emu

import (
	"encoding/xml"
	"net/url"
	"time"
)

// ActionDescribeInstanceStatus is the action that lists instances' scheduled events.
const ActionDescribeInstanceStatus = "DescribeInstanceStatus"

// MaxStatusIDs is the most instance IDs EC2 accepts in one DescribeInstanceStatus call.
const MaxStatusIDs = 100

// statusRequest is a parsed DescribeInstanceStatus request.
type statusRequest struct {
	ids        []string
	filters    []filter
	includeAll bool
	maxResults int
	nextToken  string
}

func knownStatusFilter(name string) bool {
	switch name {
	case "instance-id", "instance-state-name", "availability-zone", "event.code":
		return true
	}
	return false
}

func parseStatus(form url.Values) (statusRequest, error) {
	var req statusRequest
	var err error
	if req.ids, err = instanceIDs(form); err != nil {
		return req, err
	}
	if len(req.ids) > MaxStatusIDs {
		return req, errInvalidParameterValue("%d instance IDs were given; at most %d are allowed per DescribeInstanceStatus call", len(req.ids), MaxStatusIDs)
	}
	if req.filters, err = filters(form, knownStatusFilter); err != nil {
		return req, err
	}
	req.includeAll = form.Get("IncludeAllInstances") == "true"
	req.maxResults, req.nextToken, err = paging(form, req.ids)
	return req, err
}

type statusDetailXML struct {
	Name   string `xml:"name"`
	Status string `xml:"status"`
}

type statusSummaryXML struct {
	Status  string            `xml:"status"`
	Details []statusDetailXML `xml:"details>item"`
}

type instanceEventXML struct {
	InstanceEventID   string `xml:"instanceEventId"`
	Code              string `xml:"code"`
	Description       string `xml:"description"`
	NotBefore         string `xml:"notBefore"`
	NotAfter          string `xml:"notAfter,omitempty"`
	NotBeforeDeadline string `xml:"notBeforeDeadline,omitempty"`
}

type eventsSetXML struct {
	Items []instanceEventXML `xml:"item"`
}

type instanceStatusXML struct {
	InstanceID       string           `xml:"instanceId"`
	AvailabilityZone string           `xml:"availabilityZone"`
	EventsSet        *eventsSetXML    `xml:"eventsSet,omitempty"`
	InstanceState    stateXML         `xml:"instanceState"`
	SystemStatus     statusSummaryXML `xml:"systemStatus"`
	InstanceStatus   statusSummaryXML `xml:"instanceStatus"`
}

type instanceStatusSetXML struct {
	Items []instanceStatusXML `xml:"item"`
}

type describeInstanceStatusResponse struct {
	XMLName           xml.Name             `xml:"DescribeInstanceStatusResponse"`
	Xmlns             string               `xml:"xmlns,attr"`
	RequestID         string               `xml:"requestId"`
	InstanceStatusSet instanceStatusSetXML `xml:"instanceStatusSet"`
	NextToken         string               `xml:"nextToken,omitempty"`
}

func apiTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func (s *Server) describeStatus(req statusRequest, dryRun bool, reqID string) (*describeInstanceStatusResponse, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	if e := s.checkIDs(req.ids, ActionDescribeInstanceStatus, now); e != nil {
		return nil, e
	}
	if dryRun {
		return nil, errDryRun
	}
	candidates := req.ids
	if len(candidates) == 0 {
		candidates = s.order
	}
	var matched []instanceStatusXML
	for _, id := range candidates {
		rec := s.instances[id]
		if !s.visible(rec, ActionDescribeInstanceStatus, now) {
			continue
		}
		in := s.snapshot(rec, now)
		// Without IncludeAllInstances EC2 describes running instances only.
		if !req.includeAll && in.State != StateRunning {
			continue
		}
		if !matchStatus(in, rec.events, req.filters) {
			continue
		}
		item := instanceStatusXML{
			InstanceID: in.ID, AvailabilityZone: in.Zone, InstanceState: stateOf(in.State),
			SystemStatus:   statusSummaryXML{Status: "ok", Details: []statusDetailXML{{Name: "reachability", Status: "passed"}}},
			InstanceStatus: statusSummaryXML{Status: "ok", Details: []statusDetailXML{{Name: "reachability", Status: "passed"}}},
		}
		if in.State != StateRunning {
			item.SystemStatus = statusSummaryXML{Status: "not-applicable"}
			item.InstanceStatus = statusSummaryXML{Status: "not-applicable"}
		}
		if len(rec.events) > 0 {
			item.EventsSet = &eventsSetXML{}
			for _, e := range rec.events {
				item.EventsSet.Items = append(item.EventsSet.Items, instanceEventXML{
					InstanceEventID: e.ID, Code: e.Code, Description: e.apiDescription(),
					NotBefore: apiTime(e.NotBefore), NotAfter: apiTime(e.NotAfter), NotBeforeDeadline: apiTime(e.NotBeforeDeadline),
				})
			}
		}
		matched = append(matched, item)
	}
	page, next, e := pageOf(matched, req.maxResults, req.nextToken)
	if e != nil {
		return nil, e
	}
	resp := &describeInstanceStatusResponse{Xmlns: xmlns, RequestID: reqID, NextToken: next}
	resp.InstanceStatusSet.Items = page
	return resp, nil
}

// matchStatus applies DescribeInstanceStatus filters; event.code matches any of the
// instance's events, finished ones included (as EC2 does).
func matchStatus(in Instance, events []ScheduledEvent, fs []filter) bool {
	for _, f := range fs {
		if f.name != "event.code" {
			if !matchOne(in, f) {
				return false
			}
			continue
		}
		found := false
		for _, e := range events {
			for _, p := range f.values {
				if wildcard(p, e.Code) {
					found = true
				}
			}
		}
		if !found {
			return false
		}
	}
	return true
}
