package imds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"syscall"
)

// tracker follows one read: the HTTP status the read and the session token request were
// answered with, the token request's own error (both recorded by the client), and whether a
// connection to the service was made (httptrace), which tells a dropped answer (hop limit)
// from an address nothing answers on. Classification reads these, never error text.
type tracker struct {
	status      int // the metadata read's HTTP status; 0 for none
	tokenStatus int // the session token request's HTTP status; 0 for none
	tokenErr    error
	connected   bool
	trace       httptrace.ClientTrace
}

type trackerKey struct{}

// attach returns ctx carrying t, for the SDK's requests and the recorders.
func (t *tracker) attach(ctx context.Context) context.Context {
	t.trace.GotConn = t.gotConn
	return context.WithValue(httptrace.WithClientTrace(ctx, &t.trace), trackerKey{}, t)
}

func (t *tracker) gotConn(httptrace.GotConnInfo) { t.connected = true }

// reset forgets the previous read of the poll.
func (t *tracker) reset() { *t = tracker{trace: t.trace} }

// failure is a classified failed read.
type failure struct {
	status  int // the read's own HTTP status; 0 when it had none
	reason  string
	message string
}

const fixNetwork = "run the agent with hostNetwork: true (the chart's default) or raise the instance's " +
	"response hop limit to 2 (aws ec2 modify-instance-metadata-options --instance-id <id> --http-put-response-hop-limit 2, " +
	"or MetadataOptions.HttpPutResponseHopLimit in the launch template / EC2NodeClass)"

// timedOut: err is a deadline (the poll's timeout) or a network timeout.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// classify names the cause of a failed read and its fix, from err's types and what tr saw.
func (w *Watcher) classify(err error, tr *tracker) failure {
	endpoint := w.cfg.Endpoint
	if endpoint == "" {
		endpoint = "169.254.169.254"
	}
	if w.envDisabled {
		return failure{reason: ReasonIMDSDisabled, message: "the metadata client is disabled by " + envMetadataDisabled +
			"=true in the agent's environment; unset it to see AWS events"}
	}
	disabled := func(what string, status int) failure {
		return failure{status: status, reason: ReasonIMDSDisabled, message: fmt.Sprintf("the metadata service at %s refused %s (403): the instance's metadata endpoint is disabled; "+
			"enable it (aws ec2 modify-instance-metadata-options --instance-id <id> --http-endpoint enabled, or MetadataOptions.HttpEndpoint in the launch template / EC2NodeClass)", endpoint, what)}
	}
	if terr := tr.tokenErr; terr != nil {
		code := tr.tokenStatus
		switch {
		case code == http.StatusForbidden:
			return disabled("a session token", 0)
		case code == http.StatusNotFound || code == http.StatusMethodNotAllowed:
			return failure{reason: ReasonIMDSv1Only, message: fmt.Sprintf("the metadata service at %s has no IMDSv2 token endpoint (%d): something in front of it speaks IMDSv1 only; "+
				"nodevigil reads IMDSv2 only: remove the proxy or let the agent reach 169.254.169.254 directly (hostNetwork: true), with HttpTokens required or optional", endpoint, code)}
		case code != 0:
			return failure{reason: ReasonIMDSError, message: fmt.Sprintf("the metadata service at %s answered the session token request with %d; retrying with backoff", endpoint, code)}
		case tr.connected && timedOut(terr):
			// Connected and sent, no answer: the reply was dropped on the way back.
			return failure{reason: ReasonIMDSHopLimit, message: fmt.Sprintf("the metadata service at %s took the session token request but its answer never arrived: "+
				"the response hop limit (HttpPutResponseHopLimit=1) is too low for a pod in its own network namespace; %s", endpoint, fixNetwork)}
		}
		return failure{reason: ReasonIMDSUnreachable, message: fmt.Sprintf("the metadata service at %s could not be reached (%s): not on EC2, or blocked by a network policy or iptables rule; "+
			"on EC2, %s; off EC2 AWS events are simply not observed", endpoint, netCause(terr), fixNetwork)}
	}
	code := tr.status
	switch {
	case code == http.StatusNotFound:
		return failure{status: code}
	case code == http.StatusForbidden: // disabled after the token was issued
		return disabled("a read", code)
	case code == http.StatusUnauthorized:
		return failure{status: code, reason: ReasonIMDSError, message: "the metadata service rejected the session token (401); a new token is fetched on the next poll"}
	case code != 0:
		return failure{status: code, reason: ReasonIMDSError, message: fmt.Sprintf("the metadata service at %s answered %d; retrying with backoff", endpoint, code)}
	}
	return failure{reason: ReasonIMDSUnreachable, message: fmt.Sprintf("the metadata service at %s could not be read (%s); retrying with backoff", endpoint, netCause(err))}
}

// netCause names a network failure from its type: no answer in time, connection refused,
// no route, or the innermost error.
func netCause(err error) string {
	switch {
	case timedOut(err):
		return "no answer in time"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the address"
	}
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err.Error()
		}
		err = u
	}
}
