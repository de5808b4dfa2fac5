package kubeclient

import (
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/agent/events"
	"github.com/nodevigil/nodevigil/agent/heartbeat"
	"github.com/nodevigil/nodevigil/agent/nodepatch"
)

// The binary passes these clients to the agent: they must keep satisfying its interfaces.
var (
	_ nodepatch.NodeClient  = (*Nodes)(nil)
	_ heartbeat.LeaseClient = (*Leases)(nil)
	_ events.Sink           = (*Events)(nil)
)

const (
	protobuf  = "application/vnd.kubernetes.protobuf"
	userAgent = "nodevigil-agent/test"
)

// request is what the fake API server saw.
type request struct {
	Method, Path, Query, ContentType, Accept, UserAgent string
	Body                                                []byte
}

// apiServer is a fake API server: it records each request and answers with the next queued
// response, encoded in the first media type the client accepts (protobuf when it asks).
type apiServer struct {
	t      *testing.T
	codecs serializer.CodecFactory
	srv    *httptest.Server

	mu       sync.Mutex
	requests []request
	replies  []reply
}

type reply struct {
	code int
	obj  runtime.Object
	gv   schema.GroupVersion
}

func newAPIServer(t *testing.T) *apiServer {
	t.Helper()
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	s := &apiServer{t: t, codecs: serializer.NewCodecFactory(scheme)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *apiServer) reply(code int, obj runtime.Object, gv schema.GroupVersion) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies = append(s.replies, reply{code, obj, gv})
}

func (s *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"),
		r.Header.Get("Accept"), r.Header.Get("User-Agent"), body})
	if len(s.replies) == 0 {
		s.mu.Unlock()
		http.Error(w, "no reply queued", http.StatusInternalServerError)
		return
	}
	rep := s.replies[0]
	s.replies = s.replies[1:]
	s.mu.Unlock()

	mediaType := "application/json"
	if strings.HasPrefix(r.Header.Get("Accept"), protobuf) {
		mediaType = protobuf
	}
	info, ok := runtime.SerializerInfoForMediaType(s.codecs.SupportedMediaTypes(), mediaType)
	if !ok {
		s.t.Errorf("no serializer for %s", mediaType)
		return
	}
	w.Header().Set("Content-Type", mediaType)
	w.WriteHeader(rep.code)
	if err := s.codecs.EncoderForVersion(info.Serializer, rep.gv).Encode(rep.obj, w); err != nil {
		s.t.Errorf("encode reply: %v", err)
	}
}

func (s *apiServer) last(t *testing.T) request {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		t.Fatal("no request reached the server")
	}
	return s.requests[len(s.requests)-1]
}

// decode decodes a request body sent as contentType into into.
func (s *apiServer) decode(t *testing.T, req request, into runtime.Object) {
	t.Helper()
	mediaType, _, err := mime.ParseMediaType(req.ContentType)
	if err != nil {
		t.Fatalf("content type %q: %v", req.ContentType, err)
	}
	info, ok := runtime.SerializerInfoForMediaType(s.codecs.SupportedMediaTypes(), mediaType)
	if !ok {
		t.Fatalf("no serializer for %s", mediaType)
	}
	if _, _, err := s.codecs.DecoderToVersion(info.Serializer, nil).Decode(req.Body, nil, into); err != nil {
		t.Fatalf("decode request body: %v", err)
	}
}

// restConfig is what agent/config.RESTConfig produces, pointed at the fake server.
func (s *apiServer) restConfig() *rest.Config {
	rc := &rest.Config{Host: s.srv.URL, QPS: 5, Burst: 10, UserAgent: userAgent}
	rc.ContentType = protobuf
	rc.AcceptContentTypes = protobuf + ",application/json"
	return rc
}

func startClient(t *testing.T) (*Client, *apiServer) {
	t.Helper()
	s := newAPIServer(t)
	c, err := New(s.restConfig())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, s
}

func checkRequest(t *testing.T, got request, method, path, query, contentType string) {
	t.Helper()
	if got.Method != method || got.Path != path || got.Query != query {
		t.Errorf("request = %s %s?%s, want %s %s?%s", got.Method, got.Path, got.Query, method, path, query)
	}
	if contentType != "" && !strings.HasPrefix(got.ContentType, contentType) {
		t.Errorf("Content-Type = %q, want %q", got.ContentType, contentType)
	}
	if got.UserAgent != userAgent {
		t.Errorf("User-Agent = %q, want %q", got.UserAgent, userAgent)
	}
	if !strings.HasPrefix(got.Accept, protobuf) {
		t.Errorf("Accept = %q, want protobuf first", got.Accept)
	}
}

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "uid-1", ResourceVersion: "7"},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}}}
}

func TestNodes(t *testing.T) {
	ctx := context.Background()
	c, s := startClient(t)

	s.reply(http.StatusOK, node("node-a"), corev1.SchemeGroupVersion)
	got, err := c.Nodes().Get(ctx, "node-a", metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	checkRequest(t, s.last(t), http.MethodGet, "/api/v1/nodes/node-a", "resourceVersion=0", "")
	if got.Name != "node-a" || got.UID != "uid-1" || len(got.Spec.Taints) != 1 || got.Spec.Taints[0].Value != "db" {
		t.Errorf("Get = %+v", got)
	}

	for _, tc := range []struct {
		name         string
		pt           types.PatchType
		subresources []string
		opts         metav1.PatchOptions
		path, query  string
	}{
		{"status strategic merge", types.StrategicMergePatchType, []string{"status"}, metav1.PatchOptions{}, "/api/v1/nodes/node-a/status", ""},
		{"spec merge", types.MergePatchType, nil, metav1.PatchOptions{FieldManager: "nodevigil"}, "/api/v1/nodes/node-a", "fieldManager=nodevigil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"metadata":{"resourceVersion":"7"}}`)
			s.reply(http.StatusOK, node("node-a"), corev1.SchemeGroupVersion)
			if _, err := c.Nodes().Patch(ctx, "node-a", tc.pt, body, tc.opts, tc.subresources...); err != nil {
				t.Fatalf("Patch: %v", err)
			}
			req := s.last(t)
			checkRequest(t, req, http.MethodPatch, tc.path, tc.query, string(tc.pt))
			if string(req.Body) != string(body) {
				t.Errorf("patch body = %s, want %s", req.Body, body)
			}
		})
	}
}

func TestErrorsKeepTheirStatus(t *testing.T) {
	ctx := context.Background()
	c, s := startClient(t)
	for _, tc := range []struct {
		name string
		err  *apierrors.StatusError
		is   func(error) bool
	}{
		{"not found", apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "node-a"), apierrors.IsNotFound},
		{"conflict", apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "node-a", nil), apierrors.IsConflict},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "node-b", nil), apierrors.IsForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.err.Status()
			s.reply(int(st.Code), &st, schema.GroupVersion{Version: "v1"})
			_, err := c.Leases("ns").Get(ctx, "node-a", metav1.GetOptions{})
			if !tc.is(err) {
				t.Errorf("error %v (%T) does not classify as %s", err, err, tc.name)
			}
		})
	}
}

func lease() *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Namespace: "nodevigil-system", ResourceVersion: "3",
			Labels: map[string]string{"nodevigil.io/node": "node-a"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("agent-pod"), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)))},
	}
}

func TestLeases(t *testing.T) {
	ctx := context.Background()
	c, s := startClient(t)
	leases := c.Leases("nodevigil-system")
	gv := coordinationv1.SchemeGroupVersion

	s.reply(http.StatusOK, lease(), gv)
	got, err := leases.Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	checkRequest(t, s.last(t), http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/nodevigil-system/leases/node-a", "", "")
	if ptr.Deref(got.Spec.HolderIdentity, "") != "agent-pod" || got.ResourceVersion != "3" {
		t.Errorf("Get = %+v", got)
	}

	for _, tc := range []struct {
		name   string
		call   func() (*coordinationv1.Lease, error)
		method string
		path   string
	}{
		{"create", func() (*coordinationv1.Lease, error) { return leases.Create(ctx, lease(), metav1.CreateOptions{}) },
			http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/nodevigil-system/leases"},
		{"update", func() (*coordinationv1.Lease, error) { return leases.Update(ctx, lease(), metav1.UpdateOptions{}) },
			http.MethodPut, "/apis/coordination.k8s.io/v1/namespaces/nodevigil-system/leases/node-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := lease()
			stored.ResourceVersion = "4"
			s.reply(http.StatusOK, stored, gv)
			got, err := tc.call()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got.ResourceVersion != "4" {
				t.Errorf("returned resourceVersion %q, want the server's 4", got.ResourceVersion)
			}
			req := s.last(t)
			checkRequest(t, req, tc.method, tc.path, "", protobuf)
			sent := &coordinationv1.Lease{}
			s.decode(t, req, sent)
			if sent.Name != "node-a" || ptr.Deref(sent.Spec.LeaseDurationSeconds, 0) != 40 || sent.Labels["nodevigil.io/node"] != "node-a" {
				t.Errorf("sent lease = %+v", sent)
			}
		})
	}
}

func TestEvents(t *testing.T) {
	ctx := context.Background()
	c, s := startClient(t)
	var sink events.Sink = c.Events(metav1.NamespaceDefault)
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "node-a.1812", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"},
		Reason:         "StartupTaintsRemoved", Message: "Removed", Type: corev1.EventTypeNormal, Count: 1,
		Source: corev1.EventSource{Component: "nodevigil-agent", Host: "node-a"},
	}
	const path = "/api/v1/namespaces/default/events"

	s.reply(http.StatusCreated, ev, corev1.SchemeGroupVersion)
	if _, err := sink.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	req := s.last(t)
	checkRequest(t, req, http.MethodPost, path, "", protobuf)
	sent := &corev1.Event{}
	s.decode(t, req, sent)
	if sent.Reason != ev.Reason || sent.InvolvedObject.Name != "node-a" || sent.Source.Component != "nodevigil-agent" {
		t.Errorf("sent event = %+v", sent)
	}

	patch, _ := json.Marshal(map[string]any{"count": 2})
	stored := ev.DeepCopy()
	stored.Count = 2
	s.reply(http.StatusOK, stored, corev1.SchemeGroupVersion)
	got, err := sink.Patch(ctx, ev.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("Patch: %v", err)
	}
	if got.Count != 2 {
		t.Errorf("Patch returned count %d, want the server's 2", got.Count)
	}
	req = s.last(t)
	checkRequest(t, req, http.MethodPatch, path+"/node-a.1812", "", string(types.StrategicMergePatchType))
	if string(req.Body) != string(patch) {
		t.Errorf("patch body = %s, want %s", req.Body, patch)
	}
}

func TestNewSharesOneRateLimiter(t *testing.T) {
	s := newAPIServer(t)
	c, err := New(s.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	core, coord := c.core.GetRateLimiter(), c.coord.GetRateLimiter()
	if core == nil || core != coord {
		t.Errorf("rate limiters core=%p coordination=%p, want one shared limiter", core, coord)
	}
	if got := core.QPS(); got != 5 {
		t.Errorf("QPS = %v, want 5", got)
	}

	rc := s.restConfig()
	rc.Burst = 0
	if _, err := New(rc); err == nil || !strings.Contains(err.Error(), "burst") {
		t.Errorf("New with QPS and no burst = %v, want a burst error", err)
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestSchemeHasOnlyTheAgentsGroups(t *testing.T) {
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gvk  schema.GroupVersionKind
		want bool
	}{
		{corev1.SchemeGroupVersion.WithKind("Node"), true},
		{corev1.SchemeGroupVersion.WithKind("Event"), true},
		{coordinationv1.SchemeGroupVersion.WithKind("Lease"), true},
		{corev1.SchemeGroupVersion.WithKind("Status"), true},
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, false},
		{schema.GroupVersionKind{Group: "events.k8s.io", Version: "v1", Kind: "Event"}, false},
	} {
		if got := scheme.Recognizes(tc.gvk); got != tc.want {
			t.Errorf("scheme recognizes %s = %v, want %v", tc.gvk, got, tc.want)
		}
	}
}
