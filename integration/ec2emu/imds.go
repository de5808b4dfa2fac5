package ec2emu

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// IMDSMode is how an instance's metadata service answers, after the instance's metadata
// options (HttpEndpoint, HttpTokens, HttpPutResponseHopLimit) or what stands in front of it.
type IMDSMode int

const (
	// IMDSv2Required is HttpTokens=required: a session token from PUT /latest/api/token is
	// needed for every read; a read without a valid one is answered 401. The default.
	IMDSv2Required IMDSMode = iota
	// IMDSv1Only is an endpoint that knows no session tokens (an old metadata proxy in front
	// of the real service): PUT /latest/api/token is answered 404 and reads need no token.
	IMDSv1Only
	// IMDSDisabled is HttpEndpoint=disabled: every request is answered 403.
	IMDSDisabled
	// IMDSHopLimitExceeded is HttpPutResponseHopLimit=1 seen from a pod's own network
	// namespace: the token response is dropped one hop short of the caller, so PUT
	// /latest/api/token never answers (the call is held until the client gives up), and
	// reads without a token get 401.
	IMDSHopLimitExceeded
)

// Constants of the token flow, as the real service has them.
const (
	imdsTokenHeader    = "X-Aws-Ec2-Metadata-Token"
	imdsTTLHeader      = "X-Aws-Ec2-Metadata-Token-Ttl-Seconds"
	imdsMaxTokenTTL    = 21600
	imdsTimeLayout     = "2 Jan 2006 15:04:05 GMT"
	imdsMetadataPrefix = "/latest/meta-data/"
)

// metadata is the emulated instance metadata of one instance.
type metadata struct {
	mode          IMDSMode
	spotAction    string
	spotTime      time.Time
	rebalance     time.Time
	lifecycle     string
	tokens        map[string]time.Time // token → expiry (Config.Clock)
	tokenCalls    int
	metadataCalls int
	pathCalls     map[string]int // metadata path (under /latest/meta-data/) → reads
}

// SetIMDSMode sets how instance id's metadata service answers (see IMDSMode).
func (s *Server) SetIMDSMode(id string, mode IMDSMode) {
	s.withMetadata(id, func(md *metadata) { md.mode = mode })
}

// SetSpotInstanceAction publishes a spot interruption notice in instance id's metadata
// (spot/instance-action): action is terminate, stop or hibernate, at the time AWS will act.
// An empty action withdraws the notice (the path answers 404 again).
func (s *Server) SetSpotInstanceAction(id, action string, at time.Time) {
	s.withMetadata(id, func(md *metadata) { md.spotAction, md.spotTime = action, at })
}

// SetRebalanceRecommendation publishes a rebalance recommendation (events/recommendations/
// rebalance) noticed at t; the zero time withdraws it.
func (s *Server) SetRebalanceRecommendation(id string, t time.Time) {
	s.withMetadata(id, func(md *metadata) { md.rebalance = t })
}

// SetTargetLifecycleState sets autoscaling/target-lifecycle-state (InService, Terminated,
// Warmed:Stopped, ...); empty means the instance is not in an Auto Scaling group (404).
func (s *Server) SetTargetLifecycleState(id, state string) {
	s.withMetadata(id, func(md *metadata) { md.lifecycle = state })
}

// IMDSPathReads returns how many reads of one metadata path (as under /latest/meta-data/,
// e.g. "spot/instance-action") instance id's metadata service received, whatever their
// outcome.
func (s *Server) IMDSPathReads(id, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.instances[id]; ok {
		return rec.md.pathCalls[path]
	}
	return 0
}

// IMDSCalls returns how many token requests and how many metadata reads instance id's
// metadata service received, whatever their outcome.
func (s *Server) IMDSCalls(id string) (tokens, reads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.instances[id]; ok {
		return rec.md.tokenCalls, rec.md.metadataCalls
	}
	return 0, 0
}

func (s *Server) withMetadata(id string, fn func(*metadata)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.instances[id]; ok {
		fn(&rec.md)
	}
}

// IMDSHandler is instance id's metadata service as an http.Handler (mount it on an
// httptest.Server). An instance added later under the same ID is served too.
func (s *Server) IMDSHandler(id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveIMDS(id, w, r) })
}

// StartIMDS serves instance id's metadata service on a loopback port of its own, as each EC2
// instance has its own 169.254.169.254, and returns its base URL (the value for
// AWS_EC2_METADATA_SERVICE_ENDPOINT). Close and Shutdown stop it with the API endpoint.
func (s *Server) StartIMDS(id string) (string, error) {
	s.mu.Lock()
	_, ok := s.instances[id]
	s.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("ec2 emulator: start imds: no instance %s", id)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("ec2 emulator: start imds for %s: %w", id, err)
	}
	srv := &http.Server{Handler: s.IMDSHandler(id), ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.imdsServers = append(s.imdsServers, srv)
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// imdsError answers like the metadata service: a plain-text status line, no JSON.
func imdsError(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(strconv.Itoa(status) + " - " + http.StatusText(status) + "\n"))
}

func (s *Server) serveIMDS(id string, w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	rec, ok := s.instances[id]
	if !ok {
		s.mu.Unlock()
		imdsError(w, http.StatusNotFound)
		return
	}
	md := &rec.md
	mode := md.mode
	isToken := r.URL.Path == "/latest/api/token"
	if isToken {
		md.tokenCalls++
	} else {
		md.metadataCalls++
		if md.pathCalls == nil {
			md.pathCalls = map[string]int{}
		}
		md.pathCalls[strings.TrimPrefix(r.URL.Path, imdsMetadataPrefix)]++
	}
	s.mu.Unlock()

	if mode == IMDSDisabled {
		imdsError(w, http.StatusForbidden)
		return
	}
	if isToken {
		s.serveToken(rec, mode, w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		imdsError(w, http.StatusMethodNotAllowed)
		return
	}
	if mode != IMDSv1Only && !s.validToken(rec, r.Header.Get(imdsTokenHeader)) {
		imdsError(w, http.StatusUnauthorized)
		return
	}
	body, status := s.metadataPath(id, rec, strings.TrimPrefix(r.URL.Path, imdsMetadataPrefix))
	if status != http.StatusOK {
		imdsError(w, status)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(body))
}

func (s *Server) serveToken(rec *record, mode IMDSMode, w http.ResponseWriter, r *http.Request) {
	switch {
	case mode == IMDSv1Only:
		imdsError(w, http.StatusNotFound)
		return
	case r.Method != http.MethodPut:
		imdsError(w, http.StatusMethodNotAllowed)
		return
	case r.Header.Get("X-Forwarded-For") != "":
		// The real service refuses token requests that went through a proxy.
		imdsError(w, http.StatusForbidden)
		return
	case mode == IMDSHopLimitExceeded:
		// The response would be dropped by the hop limit: the caller never hears back.
		<-r.Context().Done()
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get(imdsTTLHeader))
	if err != nil || ttl < 1 || ttl > imdsMaxTokenTTL {
		imdsError(w, http.StatusBadRequest)
		return
	}
	var raw [24]byte
	_, _ = rand.Read(raw[:])
	tok := hex.EncodeToString(raw[:])
	s.mu.Lock()
	if rec.md.tokens == nil {
		rec.md.tokens = map[string]time.Time{}
	}
	now := s.cfg.Clock.Now()
	for t, exp := range rec.md.tokens {
		if !now.Before(exp) {
			delete(rec.md.tokens, t)
		}
	}
	rec.md.tokens[tok] = now.Add(time.Duration(ttl) * time.Second)
	s.mu.Unlock()
	w.Header().Set(imdsTTLHeader, strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(tok))
}

func (s *Server) validToken(rec *record, tok string) bool {
	if tok == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := rec.md.tokens[tok]
	return ok && s.cfg.Clock.Now().Before(exp)
}

// imdsEvent is one element of events/maintenance/scheduled, with the metadata service's own
// field names and time format.
type imdsEvent struct {
	NotBefore         string `json:"NotBefore"`
	Code              string `json:"Code"`
	Description       string `json:"Description"`
	EventID           string `json:"EventId"`
	NotAfter          string `json:"NotAfter,omitempty"`
	NotBeforeDeadline string `json:"NotBeforeDeadline,omitempty"`
	State             string `json:"State"`
}

func imdsTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(imdsTimeLayout)
}

// metadataPath answers one metadata path of instance id.
func (s *Server) metadataPath(id string, rec *record, p string) (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	md := rec.md
	switch p {
	case "instance-id":
		return id, http.StatusOK
	case "placement/availability-zone":
		return rec.inst.Zone, http.StatusOK
	case "instance-life-cycle":
		// The purchasing option; DescribeInstances omits instanceLifecycle for on-demand, the
		// metadata service says so.
		if rec.inst.Lifecycle == "" {
			return "on-demand", http.StatusOK
		}
		return rec.inst.Lifecycle, http.StatusOK
	case "spot/instance-action":
		if md.spotAction == "" {
			return "", http.StatusNotFound
		}
		b, _ := json.Marshal(map[string]string{"action": md.spotAction, "time": md.spotTime.UTC().Format(time.RFC3339)})
		return string(b), http.StatusOK
	case "events/recommendations/rebalance":
		if md.rebalance.IsZero() {
			return "", http.StatusNotFound
		}
		b, _ := json.Marshal(map[string]string{"noticeTime": md.rebalance.UTC().Format(time.RFC3339)})
		return string(b), http.StatusOK
	case "events/maintenance/scheduled", "events/maintenance/history":
		history := p == "events/maintenance/history"
		out := []imdsEvent{}
		for _, e := range rec.events {
			if history && e.State == EventStateActive {
				continue
			}
			out = append(out, imdsEvent{
				NotBefore: imdsTime(e.NotBefore), NotAfter: imdsTime(e.NotAfter), NotBeforeDeadline: imdsTime(e.NotBeforeDeadline),
				Code: e.Code, Description: e.Description, EventID: e.ID, State: e.State,
			})
		}
		b, _ := json.Marshal(out)
		return string(b), http.StatusOK
	case "autoscaling/target-lifecycle-state":
		if md.lifecycle == "" {
			return "", http.StatusNotFound
		}
		return md.lifecycle, http.StatusOK
	}
	return "", http.StatusNotFound
}

// closeIMDS stops every metadata listener started with StartIMDS.
func (s *Server) closeIMDS() error {
	s.mu.Lock()
	srvs := s.imdsServers
	s.imdsServers = nil
	s.mu.Unlock()
	var errs []error
	for _, srv := range srvs {
		if err := srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
