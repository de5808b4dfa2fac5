package ec2

import (
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// bodyWithoutWriteTo wraps the SDK's HTTP client to work around a race between smithy-go
// (v1.28.8) and net/http (seen with Go 1.26) that turns a successful response into a
// transport error, and so into a retry — a second TerminateInstances for instances already
// shutting down.
//
// smithy-go wraps each request body in a "safe" closer and closes it as soon as Do returns,
// i.e. once the response headers are in. net/http's writer may at that moment still be
// checking the body for bytes beyond Content-Length with io.Copy, which prefers the body's
// WriteTo; the closed safe closer's WriteTo returns io.EOF as an error, the writer treats it as
// a failed write and closes the connection while the response body is being read ("use of
// closed network connection"). Against a fast endpoint (loopback, a VPC endpoint) this hit
// several percent of calls with multi-kilobyte responses.
//
// Hiding WriteTo makes io.Copy use Read, for which a closed safe closer returns a clean EOF.
type bodyWithoutWriteTo struct {
	next aws.HTTPClient
}

// readOnlyBody exposes only Read and Close of the body it wraps.
type readOnlyBody struct {
	io.ReadCloser
}

func (c bodyWithoutWriteTo) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = readOnlyBody{req.Body}
	}
	return c.next.Do(req)
}
