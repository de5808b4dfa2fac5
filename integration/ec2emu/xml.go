package ec2emu

import (
	"bytes"
	"encoding/xml"
	"net/http"
	"strconv"
)

// xmlns is the namespace EC2 puts on every response document of API version 2016-11-15.
const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

// The types below mirror the response documents in the EC2 API reference, reduced to the
// elements nodevigil reads. Sets are wrapper structs rather than `a>b` paths so that an empty
// set is still written as an empty element, as EC2 does.

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

func stateOf(name string) stateXML { return stateXML{Code: stateCodes[name], Name: name} }

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type tagSetXML struct {
	Items []tagXML `xml:"item"`
}

type placementXML struct {
	AvailabilityZone string `xml:"availabilityZone"`
}

type instanceXML struct {
	InstanceID    string       `xml:"instanceId"`
	InstanceState stateXML     `xml:"instanceState"`
	Placement     placementXML `xml:"placement"`
	TagSet        tagSetXML    `xml:"tagSet"`
	// InstanceLifecycle is present only for spot (and scheduled, capacity-block) instances.
	InstanceLifecycle string `xml:"instanceLifecycle,omitempty"`
}

type instancesSetXML struct {
	Items []instanceXML `xml:"item"`
}

type reservationXML struct {
	ReservationID string          `xml:"reservationId"`
	OwnerID       string          `xml:"ownerId"`
	InstancesSet  instancesSetXML `xml:"instancesSet"`
}

type reservationSetXML struct {
	Items []reservationXML `xml:"item"`
}

type describeInstancesResponse struct {
	XMLName        xml.Name          `xml:"DescribeInstancesResponse"`
	Xmlns          string            `xml:"xmlns,attr"`
	RequestID      string            `xml:"requestId"`
	ReservationSet reservationSetXML `xml:"reservationSet"`
	NextToken      string            `xml:"nextToken,omitempty"`
}

type stateChangeXML struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  stateXML `xml:"currentState"`
	PreviousState stateXML `xml:"previousState"`
}

type stateChangeSetXML struct {
	Items []stateChangeXML `xml:"item"`
}

type terminateInstancesResponse struct {
	XMLName      xml.Name          `xml:"TerminateInstancesResponse"`
	Xmlns        string            `xml:"xmlns,attr"`
	RequestID    string            `xml:"requestId"`
	InstancesSet stateChangeSetXML `xml:"instancesSet"`
}

type errorXML struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

// errorResponse is EC2's error envelope. Note RequestID (upper-case ID) here, unlike the
// requestId element of successful responses: the SDK reads exactly these names.
type errorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []errorXML `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

func instanceToXML(in Instance) instanceXML {
	out := instanceXML{
		InstanceID:        in.ID,
		InstanceState:     stateOf(in.State),
		Placement:         placementXML{AvailabilityZone: in.Zone},
		InstanceLifecycle: in.Lifecycle,
	}
	for _, k := range sortedKeys(in.Tags) {
		out.TagSet.Items = append(out.TagSet.Items, tagXML{Key: k, Value: in.Tags[k]})
	}
	return out
}

// reservationID derives a stable reservation ID from the instance ID: the emulator puts each
// instance in a reservation of its own.
func reservationID(instanceID string) string {
	return "r-" + instanceID[len("i-"):]
}

// writeXML encodes v with the XML declaration and sends it with status.
func writeXML(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	enc := xml.NewEncoder(&buf)
	enc.Indent("", "    ")
	if err := enc.Encode(v); err != nil {
		// Only reachable through a programming error in the response types.
		http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/xml;charset=UTF-8")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, requestID string, e *apiError) {
	writeXML(w, e.status, errorResponse{
		Errors:    []errorXML{{Code: e.code, Message: e.message}},
		RequestID: requestID,
	})
}
