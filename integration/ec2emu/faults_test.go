package ec2emu

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestThrottleFor(t *testing.T) {
	s, clk := newTestServer(t, Config{})
	s.ThrottleFor("", 5*time.Second)
	for _, a := range []string{ActionDescribeInstances, ActionTerminateInstances} {
		if code, body := do(t, s, form(a, idA)); code != http.StatusServiceUnavailable || errorCode(t, body) != "RequestLimitExceeded" {
			t.Fatalf("%s during the storm: %d %s, want 503 RequestLimitExceeded", a, code, body)
		}
	}
	clk.Step(4 * time.Second)
	if code, _ := do(t, s, form(ActionDescribeInstances, idA)); code != http.StatusServiceUnavailable {
		t.Fatalf("storm ended early: %d", code)
	}
	clk.Step(time.Second)
	if code, body := do(t, s, form(ActionTerminateInstances, idA)); code != http.StatusOK {
		t.Fatalf("after the storm: %d %s", code, body)
	}
	if n := s.Terminations(idA); n != 1 {
		t.Errorf("Terminations = %d, want 1 (throttled calls carried out nothing)", n)
	}
	s.ThrottleFor(ActionDescribeInstances, time.Minute)
	s.ThrottleFor(ActionDescribeInstances, 0)
	if code, _ := do(t, s, form(ActionDescribeInstances, idA)); code != http.StatusOK {
		t.Errorf("ThrottleFor 0 did not end the storm: %d", code)
	}
}

func TestUnauthorizedInstance(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	s.SetUnauthorizedInstance(idA, true)
	code, body := do(t, s, form(ActionTerminateInstances, idA, idB))
	if code != http.StatusForbidden || errorCode(t, body) != "UnauthorizedOperation" {
		t.Fatalf("a call naming the denied instance: %d %s, want 403 UnauthorizedOperation for the whole call", code, body)
	}
	if s.Terminations(idB) != 0 {
		t.Error("the refused call terminated the other instance")
	}
	if code, _ := do(t, s, form(ActionTerminateInstances, idB)); code != http.StatusOK {
		t.Errorf("an allowed instance alone: %d", code)
	}
	if code, _ := do(t, s, form(ActionDescribeInstances, idA)); code != http.StatusOK {
		t.Errorf("DescribeInstances of the denied instance: %d, want 200", code)
	}
	s.SetUnauthorizedInstance(idA, false)
	if code, _ := do(t, s, form(ActionTerminateInstances, idA)); code != http.StatusOK {
		t.Errorf("after lifting the denial: %d", code)
	}
}

func TestHoldTerminate(t *testing.T) {
	tests := []struct {
		mode           HoldMode
		wantTerminated int // after the caller gave up
	}{{HoldBeforeAccept, 0}, {HoldAfterAccept, 1}}
	for _, tt := range tests {
		t.Run(map[HoldMode]string{HoldBeforeAccept: "before", HoldAfterAccept: "after"}[tt.mode], func(t *testing.T) {
			s, _ := newTestServer(t, Config{})
			arrived := s.HoldTerminate(idA, tt.mode)
			ctx, cancel := context.WithCancel(context.Background())
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(form(ActionTerminateInstances, idA).Encode())).WithContext(ctx)
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
			sign(r)
			done := make(chan int)
			go func() {
				w := httptest.NewRecorder()
				s.ServeHTTP(w, r)
				done <- w.Code
			}()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the call never reached the hold")
			}
			select {
			case code := <-done:
				t.Fatalf("a held call answered %d", code)
			case <-time.After(50 * time.Millisecond):
			}
			cancel() // the caller dies
			<-done
			if got := s.Terminations(idA); got != tt.wantTerminated {
				t.Errorf("Terminations after the caller died = %d, want %d", got, tt.wantTerminated)
			}
			s.ReleaseHold(idA)
			if code, _ := do(t, s, form(ActionTerminateInstances, idA)); code != http.StatusOK {
				t.Errorf("after ReleaseHold: %d", code)
			}
		})
	}
}
