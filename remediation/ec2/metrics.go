package ec2

import (
	"context"
	"errors"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// knownCodes bounds the code label of nodevigil_ec2_requests_total: EC2 has hundreds of error
// codes, the remediator meets a handful, and everything else is counted as "other".
var knownCodes = map[string]bool{
	codeThrottled:           true,
	codeUnauthorized:        true,
	codeNotFound:            true,
	codeMalformed:           true,
	"AuthFailure":           true,
	"InternalError":         true,
	"Unavailable":           true,
	"ServiceUnavailable":    true,
	"InvalidParameterValue": true,
}

// metrics are the client's Prometheus instruments. Operations are DescribeInstances and
// TerminateInstances, so every label is bounded.
type metrics struct {
	// duration is per operation, retries included: what the remediator waits for.
	duration *prometheus.HistogramVec
	// requests is per HTTP attempt: it shows throttling that the retryer absorbed.
	requests *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodevigil_ec2_request_duration_seconds",
			Help:    "Duration of EC2 API operations, retries included, by operation and result (success or error).",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"operation", "result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_ec2_requests_total",
			Help: "EC2 API request attempts by operation and response code (ok, an EC2 error code, other, transport or canceled).",
		}, []string{"operation", "code"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.duration, err = register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered under the same
// description, so that two clients can share a registry.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

func (m *metrics) observe(operation string, start time.Time, err error) {
	result := "success"
	if err != nil {
		result = "error"
	}
	m.duration.WithLabelValues(operation, result).Observe(time.Since(start).Seconds())
}

// codeLabel turns the error of one attempt into a bounded label value.
func codeLabel(err error) string {
	if err == nil {
		return "ok"
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		if knownCodes[apiErr.ErrorCode()] {
			return apiErr.ErrorCode()
		}
		return "other"
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "canceled"
	}
	return "transport"
}

// countAttempts adds a middleware below the SDK's retry middleware, so it sees every HTTP
// attempt with its deserialized error, and counts it.
func (m *metrics) countAttempts(stack *middleware.Stack) error {
	return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("nodevigil.CountAttempts",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			out, md, err := next.HandleFinalize(ctx, in)
			m.requests.WithLabelValues(awsmiddleware.GetOperationName(ctx), codeLabel(err)).Inc()
			return out, md, err
		}), "Retry", middleware.After)
}
