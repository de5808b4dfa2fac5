// Package ec2emu is an in-process emulator of the Amazon EC2 API actions nodevigil uses,
// DescribeInstances, DescribeInstanceStatus and TerminateInstances, and of each instance's
// metadata service (IMDSv2, see StartIMDS), speaking the real EC2 Query protocol over HTTP:
// form-encoded (or query-string) requests signed with SigV4, XML responses and the
// <Response><Errors> error envelope, with the HTTP statuses EC2 uses. The real
// aws-sdk-go-v2 EC2 client talks to it unchanged through its BaseEndpoint, so the remediator's
// termination path is tested through the same code that runs against AWS.
//
// It exists because the failures that matter for a remediator — throttling
// (RequestLimitExceeded), missing IAM permissions (UnauthorizedOperation), eventual consistency
// (InvalidInstanceID.NotFound for an instance that exists) and duplicate terminations — cannot
// be produced on demand against AWS. Every fault can be switched on and off while requests are
// in flight, and the server records what it was asked to do so tests can assert, for example,
// that an instance was terminated exactly once.
//
// Instance state moves running → shutting-down → terminated, driven by Config.Clock, so tests
// with a fake clock are deterministic.
package ec2emu

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Action names the emulator implements, as sent in the Action parameter.
const (
	ActionDescribeInstances  = "DescribeInstances"
	ActionTerminateInstances = "TerminateInstances"
)

// MaxTerminateIDs is the most instance IDs EC2 accepts in one TerminateInstances call.
const MaxTerminateIDs = 1000

const (
	defaultShutdownDelay = 10 * time.Second
	defaultZone          = "us-east-1a"
	defaultAddr          = "127.0.0.1:0"
	ownerID              = "123456789012"
	maxBodyBytes         = 1 << 20
)

// Config configures a Server. The zero value is usable.
type Config struct {
	// Addr is the address Start listens on. Default "127.0.0.1:0" (a free loopback port).
	Addr string
	// Clock drives the shutting-down → terminated transition and the eventual-consistency
	// window. Default: the real clock. Use k8s.io/utils/clock/testing in tests.
	Clock clock.PassiveClock
	// ShutdownDelay is how long a terminated instance stays "shutting-down" before it reads
	// "terminated". Zero means the default, 10s; a negative value means no delay at all.
	ShutdownDelay time.Duration
	// NotFoundFor is how long an instance terminated while SetNotFoundAfterTerminate is on
	// stays invisible (InvalidInstanceID.NotFound). Zero means until the fault is switched off.
	NotFoundFor time.Duration
	// DefaultZone is the Availability Zone of instances added without one. Default us-east-1a.
	DefaultZone string
	// Logger receives one record per API call. Default: discard.
	Logger *slog.Logger
}

// record is the emulator's state for one instance.
type record struct {
	inst         Instance // State is the seeded state; it no longer applies once terminating
	terminating  bool
	terminatedAt time.Time
	hiddenFor    map[string]bool  // action ("" for every action) → answers NotFound
	ecHidden     bool             // hidden by the eventual-consistency fault
	ecUntil      time.Time        // end of the eventual-consistency window; zero means open-ended
	terminations int              // successful TerminateInstances calls that named it
	events       []ScheduledEvent // scheduled events, finished ones included
	md           metadata         // the instance's metadata service
}

// Server is the emulated EC2 endpoint. It is an http.Handler, so it can be mounted on an
// httptest.Server, or served on its own listener with Start. All methods are safe for
// concurrent use, including while requests are being served.
type Server struct {
	cfg Config
	log *slog.Logger
	seq atomic.Uint64

	mu             sync.Mutex
	order          []string // instance IDs in the order they were added: the listing order
	instances      map[string]*record
	throttle       map[string]int       // action ("" for any) → calls left to throttle; negative: forever
	throttleUntil  map[string]time.Time // action ("" for any) → throttled until then (Config.Clock)
	unauthorized   map[string]bool
	deniedIDs      map[string]bool  // instance IDs TerminateInstances is not allowed to name
	holds          map[string]*hold // instance ID → TerminateInstances calls naming it are held
	latency        time.Duration
	notFoundAfter  bool
	calls          map[string]int
	total          int
	terminateCalls [][]string

	srv         *http.Server
	addr        string
	done        chan struct{}
	imdsServers []*http.Server // per-instance metadata services (StartIMDS)
}

// New returns a Server with no instances and no faults.
func New(cfg Config) *Server {
	if cfg.Addr == "" {
		cfg.Addr = defaultAddr
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ShutdownDelay == 0 {
		cfg.ShutdownDelay = defaultShutdownDelay
	}
	if cfg.DefaultZone == "" {
		cfg.DefaultZone = defaultZone
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		cfg:           cfg,
		log:           log,
		instances:     map[string]*record{},
		throttle:      map[string]int{},
		throttleUntil: map[string]time.Time{},
		unauthorized:  map[string]bool{},
		deniedIDs:     map[string]bool{},
		holds:         map[string]*hold{},
		calls:         map[string]int{},
	}
}

// Start serves the emulator on Config.Addr until Shutdown or Close. It is a convenience for
// the standalone binary and for tests that want a real listener; tests may equally pass the
// Server to httptest.NewServer.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("ec2 emulator: listen on %s: %w", s.cfg.Addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	s.mu.Lock()
	s.srv, s.addr, s.done = srv, ln.Addr().String(), done
	s.mu.Unlock()
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("ec2 emulator stopped serving", "err", err)
		}
	}()
	return nil
}

// URL is the base URL of a started server ("http://127.0.0.1:PORT"), the value to give the
// SDK as its BaseEndpoint. It is empty before Start.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addr == "" {
		return ""
	}
	return "http://" + s.addr
}

// Shutdown stops a started server gracefully, waiting for calls in flight until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	_ = s.closeIMDS()
	s.mu.Lock()
	srv, done := s.srv, s.done
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	<-done
	return err
}

// Close stops a started server at once, dropping calls in flight.
func (s *Server) Close() error {
	_ = s.closeIMDS()
	s.mu.Lock()
	srv, done := s.srv, s.done
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Close()
	<-done
	return err
}

// AddInstance adds (or replaces) an instance. An instance that does not validate is refused,
// so a test never seeds an instance the emulator itself would call malformed.
func (s *Server) AddInstance(in Instance) error {
	if err := in.Validate(); err != nil {
		return fmt.Errorf("add instance: %w", err)
	}
	if in.Zone == "" {
		in.Zone = s.cfg.DefaultZone
	}
	if in.State == "" {
		in.State = StateRunning
	}
	in.Tags = cloneTags(in.Tags)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.instances[in.ID]; !ok {
		s.order = append(s.order, in.ID)
	}
	s.instances[in.ID] = &record{inst: in}
	return nil
}

// Instance returns the current view of an instance, hidden or not, with its state as of now.
func (s *Server) Instance(id string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.instances[id]
	if !ok {
		return Instance{}, false
	}
	return s.snapshot(rec, s.cfg.Clock.Now()), true
}

// Instances returns every instance in the order they were added.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	out := make([]Instance, 0, len(s.order))
	for _, id := range s.order {
		out = append(out, s.snapshot(s.instances[id], now))
	}
	return out
}

// Throttle answers the next n calls of action with RequestLimitExceeded (HTTP 503), the way
// EC2 throttles an account. An empty action throttles every action. A negative n throttles
// until Throttle is called again with 0, which clears the fault.
func (s *Server) Throttle(action string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n == 0 {
		delete(s.throttle, action)
		return
	}
	s.throttle[action] = n
}

// ThrottleFor answers every call of action (every action when empty) with
// RequestLimitExceeded for d from now (Config.Clock): a throttling storm of a set length, as
// when another tool in the account floods the API. A d of zero or less ends the storm.
func (s *Server) ThrottleFor(action string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d <= 0 {
		delete(s.throttleUntil, action)
		return
	}
	s.throttleUntil[action] = s.cfg.Clock.Now().Add(d)
}

// SetUnauthorizedInstance makes TerminateInstances calls that name id fail as a whole with
// UnauthorizedOperation (HTTP 403), as EC2 does when the caller's IAM policy allows the action
// only on some resources (a tag condition, say). DescribeInstances is unaffected: it does not
// support resource-level permissions.
func (s *Server) SetUnauthorizedInstance(id string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.deniedIDs[id] = true
	} else {
		delete(s.deniedIDs, id)
	}
}

// HoldMode says where HoldTerminate stops a TerminateInstances call.
type HoldMode int

const (
	// HoldBeforeAccept holds the call before EC2 acts on it: nothing is terminated until the
	// hold is released, and nothing at all if the caller gives up (or dies) meanwhile.
	HoldBeforeAccept HoldMode = iota + 1
	// HoldAfterAccept carries the termination out, then holds the response: the caller never
	// learns that EC2 accepted if it dies meanwhile.
	HoldAfterAccept
)

type hold struct {
	mode    HoldMode
	release chan struct{}
	arrived chan struct{} // closed when a call naming the instance reached the hold
	once    sync.Once
}

// HoldTerminate holds TerminateInstances calls naming id as mode says, until ReleaseHold. It
// lets a test kill the caller at the exact moment before or after EC2 accepted a termination.
// The returned channel is closed when a call reaches the hold.
func (s *Server) HoldTerminate(id string, mode HoldMode) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &hold{mode: mode, release: make(chan struct{}), arrived: make(chan struct{})}
	s.holds[id] = h
	return h.arrived
}

// ReleaseHold lets the calls held for id go on and removes the hold.
func (s *Server) ReleaseHold(id string) {
	s.mu.Lock()
	h := s.holds[id]
	delete(s.holds, id)
	s.mu.Unlock()
	if h != nil {
		close(h.release)
	}
}

// holdFor returns the hold of mode among ids, if any.
func (s *Server) holdFor(ids []string, mode HoldMode) *hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if h := s.holds[id]; h != nil && h.mode == mode {
			return h
		}
	}
	return nil
}

// wait blocks on h until it is released or ctx ends (the caller went away).
func (h *hold) wait(ctx context.Context) error {
	h.once.Do(func() { close(h.arrived) })
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetLatency delays every call by d before it is handled (0 removes the delay). The delay is
// real time, not Config.Clock: it exists to exercise client timeouts and batching.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// SetUnauthorized makes action (every action when empty) fail with UnauthorizedOperation
// (HTTP 403), as EC2 does when the caller's IAM policy lacks the permission.
func (s *Server) SetUnauthorized(action string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.unauthorized[action] = true
	} else {
		delete(s.unauthorized, action)
	}
}

// SetNotFoundAfterTerminate emulates EC2's eventual consistency: while on, every instance
// terminated by a TerminateInstances call becomes invisible — DescribeInstances and
// TerminateInstances answer InvalidInstanceID.NotFound for it and listings leave it out — for
// Config.NotFoundFor after its termination (or until the fault is switched off when
// NotFoundFor is zero). The instance is really shutting down meanwhile. Switching the fault off
// makes every hidden instance visible again.
func (s *Server) SetNotFoundAfterTerminate(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notFoundAfter = on
	if !on {
		for _, rec := range s.instances {
			rec.ecHidden = false
		}
	}
}

// HideInstance makes one instance look unknown (InvalidInstanceID.NotFound) to action, or to
// every action when action is empty, without changing its state. It reproduces the races where
// one call sees an instance and the next does not.
func (s *Server) HideInstance(id, action string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.instances[id]
	if !ok {
		return
	}
	if on {
		if rec.hiddenFor == nil {
			rec.hiddenFor = map[string]bool{}
		}
		rec.hiddenFor[action] = true
	} else {
		delete(rec.hiddenFor, action)
	}
}

// Calls returns how many requests named action, whatever their outcome (throttled, refused and
// malformed calls included). An empty action returns the total of all requests.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if action == "" {
		return s.total
	}
	return s.calls[action]
}

// TerminateCalls returns the instance IDs of every TerminateInstances call the emulator carried
// out, in order. Calls refused with an error (throttled, unauthorized, not found) are not
// listed: they terminated nothing.
func (s *Server) TerminateCalls() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]string, len(s.terminateCalls))
	for i, ids := range s.terminateCalls {
		out[i] = append([]string(nil), ids...)
	}
	return out
}

// Terminations returns how many carried-out TerminateInstances calls named id: the number a
// test compares with 1 to prove an instance was terminated exactly once.
func (s *Server) Terminations(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.instances[id]; ok {
		return rec.terminations
	}
	return 0
}

// ServeHTTP answers one EC2 Query API request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	reqID := fmt.Sprintf("00000000-0000-4000-8000-%012x", s.seq.Add(1))
	action, ids, err := s.handle(w, r, reqID)
	code := "Success"
	if err != nil {
		code = err.code
		writeError(w, reqID, err)
	}
	s.log.Info("ec2 call", "action", action, "code", code, "instances", len(ids),
		"request_id", reqID, "duration", time.Since(start))
}

// handle dispatches a request. On success it has written the response; on failure it returns
// the error for ServeHTTP to write.
func (s *Server) handle(w http.ResponseWriter, r *http.Request, reqID string) (string, []string, *apiError) {
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		return "", nil, &apiError{status: http.StatusMethodNotAllowed, code: "UnsupportedHttpVerb",
			message: "The HTTP verb " + r.Method + " is not supported; use POST or GET"}
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if err := r.ParseForm(); err != nil {
		return "", nil, &apiError{status: 400, code: "MalformedQueryString", message: err.Error()}
	}
	form := r.Form
	action := form.Get("Action")
	s.countCall(action)

	if msg := checkSignature(r); msg != "" {
		return action, nil, &apiError{status: http.StatusUnauthorized, code: "AuthFailure", message: msg}
	}
	if action == "" {
		return action, nil, &apiError{status: 400, code: "MissingAction", message: "The request must contain the parameter Action"}
	}
	if form.Get("Version") == "" {
		return action, nil, &apiError{status: 400, code: "MissingParameter", message: "The request must contain the parameter Version"}
	}
	if err := s.sleep(r.Context()); err != nil {
		return action, nil, &apiError{status: 400, code: "RequestCanceled", message: err.Error()}
	}
	if e := s.injectedFault(action); e != nil {
		return action, nil, e
	}
	dryRun := form.Get("DryRun") == "true"
	switch action {
	case ActionDescribeInstances:
		req, err := parseDescribe(form)
		if err != nil {
			return action, nil, asAPIError(err)
		}
		resp, e := s.describe(req, dryRun, reqID)
		if e != nil {
			return action, req.ids, e
		}
		writeXML(w, http.StatusOK, resp)
		return action, req.ids, nil
	case ActionDescribeInstanceStatus:
		req, err := parseStatus(form)
		if err != nil {
			return action, nil, asAPIError(err)
		}
		resp, e := s.describeStatus(req, dryRun, reqID)
		if e != nil {
			return action, req.ids, e
		}
		writeXML(w, http.StatusOK, resp)
		return action, req.ids, nil
	case ActionTerminateInstances:
		ids, err := instanceIDs(form)
		if err != nil {
			return action, nil, asAPIError(err)
		}
		if e := s.denied(ids); e != nil {
			return action, ids, e
		}
		if h := s.holdFor(ids, HoldBeforeAccept); h != nil {
			if err := h.wait(r.Context()); err != nil {
				return action, ids, &apiError{status: 400, code: "RequestCanceled", message: err.Error()}
			}
		}
		resp, e := s.terminate(ids, dryRun, reqID)
		if e != nil {
			return action, ids, e
		}
		if h := s.holdFor(ids, HoldAfterAccept); h != nil {
			if err := h.wait(r.Context()); err != nil {
				return action, ids, &apiError{status: 400, code: "RequestCanceled", message: err.Error()}
			}
		}
		writeXML(w, http.StatusOK, resp)
		return action, ids, nil
	default:
		return action, nil, &apiError{status: 400, code: "InvalidAction",
			message: fmt.Sprintf("The action %s is not valid for this web service.", action)}
	}
}

func asAPIError(err error) *apiError {
	var e *apiError
	if errors.As(err, &e) {
		return e
	}
	return &apiError{status: 400, code: "InvalidParameterValue", message: err.Error()}
}

// checkSignature returns why the request is not SigV4-signed for EC2, or "" when it is. The
// signature itself is not verified (the emulator knows no secrets); what is checked is that the
// client signed at all, and for the ec2 service, which is what a misconfigured client gets wrong.
func checkSignature(r *http.Request) string {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		q := r.URL.Query()
		if q.Get("X-Amz-Algorithm") == "AWS4-HMAC-SHA256" && q.Get("X-Amz-Signature") != "" {
			return checkScope(q.Get("X-Amz-Credential"))
		}
		return "AWS was not able to validate the provided access credentials: the request is not signed (no Authorization header)"
	}
	algo, rest, _ := strings.Cut(auth, " ")
	if algo != "AWS4-HMAC-SHA256" {
		return fmt.Sprintf("AWS was not able to validate the provided access credentials: signature algorithm %q is not AWS4-HMAC-SHA256", algo)
	}
	fields := map[string]string{}
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		fields[k] = v
	}
	if fields["SignedHeaders"] == "" || fields["Signature"] == "" {
		return "AWS was not able to validate the provided access credentials: Authorization lacks SignedHeaders or Signature"
	}
	if r.Header.Get("X-Amz-Date") == "" {
		return "AWS was not able to validate the provided access credentials: X-Amz-Date header is missing"
	}
	return checkScope(fields["Credential"])
}

// checkScope validates a SigV4 credential "AKID/date/region/service/aws4_request".
func checkScope(credential string) string {
	parts := strings.Split(credential, "/")
	if len(parts) != 5 || parts[0] == "" || parts[4] != "aws4_request" {
		return fmt.Sprintf("AWS was not able to validate the provided access credentials: credential scope %q is malformed", credential)
	}
	if parts[3] != "ec2" {
		return fmt.Sprintf("AWS was not able to validate the provided access credentials: credential scope is for service %q, not ec2", parts[3])
	}
	return ""
}

func (s *Server) countCall(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	if action != "" {
		s.calls[action]++
	}
}

func (s *Server) sleep(ctx context.Context) error {
	s.mu.Lock()
	d := s.latency
	s.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// denied returns UnauthorizedOperation when ids name an instance SetUnauthorizedInstance denies.
func (s *Server) denied(ids []string) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.deniedIDs[id] {
			return &apiError{status: http.StatusForbidden, code: "UnauthorizedOperation",
				message: "You are not authorized to perform this operation. Encoded authorization failure message: denied for " + id}
		}
	}
	return nil
}

// injectedFault returns the throttling or authorization fault configured for action, if any.
// Throttling comes first: EC2 throttles a request before it evaluates its permissions.
func (s *Server) injectedFault(action string) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	for _, key := range []string{action, ""} {
		if until, ok := s.throttleUntil[key]; ok {
			if now.Before(until) {
				return &apiError{status: http.StatusServiceUnavailable, code: "RequestLimitExceeded", message: "Request limit exceeded."}
			}
			delete(s.throttleUntil, key)
		}
	}
	for _, key := range []string{action, ""} {
		n, ok := s.throttle[key]
		if !ok {
			continue
		}
		if n > 0 {
			if n == 1 {
				delete(s.throttle, key)
			} else {
				s.throttle[key] = n - 1
			}
		}
		return &apiError{status: http.StatusServiceUnavailable, code: "RequestLimitExceeded", message: "Request limit exceeded."}
	}
	if s.unauthorized[action] || s.unauthorized[""] {
		return &apiError{status: http.StatusForbidden, code: "UnauthorizedOperation", message: "You are not authorized to perform this operation."}
	}
	return nil
}

// state is the current state of rec.
func (s *Server) state(rec *record, now time.Time) string {
	if !rec.terminating {
		return rec.inst.State
	}
	if s.cfg.ShutdownDelay < 0 || now.Sub(rec.terminatedAt) >= s.cfg.ShutdownDelay {
		return StateTerminated
	}
	return StateShuttingDown
}

func (s *Server) snapshot(rec *record, now time.Time) Instance {
	in := rec.inst
	in.State = s.state(rec, now)
	in.Tags = cloneTags(in.Tags)
	return in
}

// visible reports whether action can see rec now.
func (s *Server) visible(rec *record, action string, now time.Time) bool {
	if rec.hiddenFor[""] || rec.hiddenFor[action] {
		return false
	}
	if rec.ecHidden && (rec.ecUntil.IsZero() || now.Before(rec.ecUntil)) {
		return false
	}
	return true
}

// checkIDs fails the whole call, as EC2 does, when any ID is malformed (the first one is
// named) or unknown to action (all of them are named).
func (s *Server) checkIDs(ids []string, action string, now time.Time) *apiError {
	for _, id := range ids {
		if !instanceIDPattern.MatchString(id) {
			return &apiError{status: 400, code: "InvalidInstanceID.Malformed",
				message: fmt.Sprintf("Invalid id: %q (expecting \"i-...\")", id)}
		}
	}
	var missing []string
	for _, id := range ids {
		rec, ok := s.instances[id]
		if !ok || !s.visible(rec, action, now) {
			missing = append(missing, id)
		}
	}
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return &apiError{status: 400, code: "InvalidInstanceID.NotFound",
			message: fmt.Sprintf("The instance ID '%s' does not exist", missing[0])}
	default:
		return &apiError{status: 400, code: "InvalidInstanceID.NotFound",
			message: fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", "))}
	}
}

var errDryRun = &apiError{status: http.StatusPreconditionFailed, code: "DryRunOperation",
	message: "Request would have succeeded, but DryRun flag is set."}

func (s *Server) describe(req describeRequest, dryRun bool, reqID string) (*describeInstancesResponse, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	if e := s.checkIDs(req.ids, ActionDescribeInstances, now); e != nil {
		return nil, e
	}
	if dryRun {
		return nil, errDryRun
	}
	candidates := req.ids
	if len(candidates) == 0 {
		candidates = s.order
	}
	var matched []Instance
	for _, id := range candidates {
		rec := s.instances[id]
		if !s.visible(rec, ActionDescribeInstances, now) {
			continue
		}
		in := s.snapshot(rec, now)
		if match(in, req.filters) {
			matched = append(matched, in)
		}
	}
	page, next, e := pageOf(matched, req.maxResults, req.nextToken)
	if e != nil {
		return nil, e
	}
	resp := &describeInstancesResponse{Xmlns: xmlns, RequestID: reqID, NextToken: next}
	for _, in := range page {
		resp.ReservationSet.Items = append(resp.ReservationSet.Items, reservationXML{
			ReservationID: reservationID(in.ID),
			OwnerID:       ownerID,
			InstancesSet:  instancesSetXML{Items: []instanceXML{instanceToXML(in)}},
		})
	}
	return resp, nil
}

// pageOf returns the page of matched that nextToken starts, at most maxResults long (0: all),
// and the token of the page after it ("" at the end), as EC2's paged Describe calls do.
func pageOf[T any](matched []T, maxResults int, nextToken string) ([]T, string, *apiError) {
	offset := 0
	if nextToken != "" {
		var ok bool
		if offset, ok = decodeToken(nextToken); !ok || offset > len(matched) {
			return nil, "", &apiError{status: 400, code: "InvalidPaginationToken",
				message: "The specified pagination token is not valid or is expired."}
		}
	}
	page, next := matched[offset:], ""
	if maxResults > 0 && len(page) > maxResults {
		page, next = page[:maxResults], encodeToken(offset+maxResults)
	}
	return page, next, nil
}

func (s *Server) terminate(ids []string, dryRun bool, reqID string) (*terminateInstancesResponse, *apiError) {
	if len(ids) == 0 {
		return nil, &apiError{status: 400, code: "MissingParameter", message: "The request must contain the parameter InstanceId"}
	}
	if len(ids) > MaxTerminateIDs {
		return nil, errInvalidParameterValue("%d instance IDs were given; at most %d are allowed per call", len(ids), MaxTerminateIDs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	if e := s.checkIDs(ids, ActionTerminateInstances, now); e != nil {
		return nil, e
	}
	if dryRun {
		return nil, errDryRun
	}
	resp := &terminateInstancesResponse{Xmlns: xmlns, RequestID: reqID}
	for _, id := range ids {
		rec := s.instances[id]
		prev := s.state(rec, now)
		if prev != StateShuttingDown && prev != StateTerminated {
			rec.terminating = true
			rec.terminatedAt = now
			if s.notFoundAfter {
				rec.ecHidden = true
				rec.ecUntil = time.Time{}
				if s.cfg.NotFoundFor > 0 {
					rec.ecUntil = now.Add(s.cfg.NotFoundFor)
				}
			}
		}
		rec.terminations++
		resp.InstancesSet.Items = append(resp.InstancesSet.Items, stateChangeXML{
			InstanceID:    id,
			CurrentState:  stateOf(s.state(rec, now)),
			PreviousState: stateOf(prev),
		})
	}
	s.terminateCalls = append(s.terminateCalls, append([]string(nil), ids...))
	return resp, nil
}

func encodeToken(offset int) string {
	return base64.RawURLEncoding.EncodeToString([]byte("offset:" + strconv.Itoa(offset)))
}

func decodeToken(tok string) (int, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, false
	}
	v, ok := strings.CutPrefix(string(raw), "offset:")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

func cloneTags(tags map[string]string) map[string]string {
	if tags == nil {
		return nil
	}
	out := make(map[string]string, len(tags))
	for k, v := range tags {
		out[k] = v
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
