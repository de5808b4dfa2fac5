package ec2

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"net/http"
)

// TestUnauthorizedForOneInstanceSparesTheBatch: an IAM policy that refuses one instance fails
// the whole TerminateInstances call; the client isolates that instance so the others of the
// batch are still terminated.
func TestUnauthorizedForOneInstanceSparesTheBatch(t *testing.T) {
	f := newFixture(t, Config{})
	ids := f.addOwned(t, 4)
	f.emu.SetUnauthorizedInstance(ids[2], true)
	out, err := f.client.Terminate(context.Background(), ids)
	if !errors.Is(err, ErrUnauthorized) {
		t.Errorf("error %v, want one wrapping ErrUnauthorized", err)
	}
	for i, id := range ids {
		want := ResultTerminating
		if i == 2 {
			want = ResultUnauthorized
		}
		if out[id].Result != want {
			t.Errorf("%s: %s (%v), want %s", id, out[id].Result, out[id].Err, want)
		}
		if wantN := map[bool]int{true: 0, false: 1}[i == 2]; f.emu.Terminations(id) != wantN {
			t.Errorf("%s terminated %d times, want %d", id, f.emu.Terminations(id), wantN)
		}
	}
}

func TestErrorKind(t *testing.T) {
	serverErr := &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 503}}, Err: errors.New("unavailable")}
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", &smithy.GenericAPIError{Code: codeThrottled}), KindThrottled},
		{fmt.Errorf("x: %w: y", ErrUnauthorized), KindUnauthorized},
		{&smithy.GenericAPIError{Code: codeUnauthorized}, KindUnauthorized},
		{serverErr, KindServer},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), KindTimeout},
		{errors.New("connection refused"), KindOther},
	}
	for _, tt := range tests {
		if got := ErrorKind(tt.err); got != tt.want {
			t.Errorf("ErrorKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
