package ec2emu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"
)

// sdkEC2 returns the real aws-sdk-go-v2 EC2 client pointed at s over real HTTP, with the
// request-body workaround the remediator's client has (remediation/ec2/transport.go).
func sdkEC2(t *testing.T, s *Server) *ec2.Client {
	t.Helper()
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return ec2.New(ec2.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(hs.URL),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "secret"}, nil
		}),
		RetryMaxAttempts: 1,
		HTTPClient:       bodyWithoutWriteTo{next: awshttp.NewBuildableClient()},
	})
}

// bodyWithoutWriteTo hides the request body's WriteTo from net/http. smithy-go closes the
// body as soon as the response headers are in; net/http may at that moment still be checking
// the body for bytes beyond Content-Length with io.Copy, which prefers WriteTo, and the closed
// body's WriteTo returns io.EOF as an error. net/http then treats the request write as failed
// and closes the connection while the response body is being read: the SDK call fails with
// "use of closed network connection" (6 of 300 runs of TestDescribeInstanceStatusLimits under
// -race without it). With Read only, a closed body gives a clean EOF. The remediator's EC2 client carries
// the same workaround; a copy here because that one is unexported.
type bodyWithoutWriteTo struct{ next ec2.HTTPClient }

func (c bodyWithoutWriteTo) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = struct{ io.ReadCloser }{req.Body}
	}
	return c.next.Do(req)
}

func TestDescribeInstanceStatusEvents(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	c := sdkEC2(t, s)
	nb := time.Date(2026, 1, 9, 9, 0, 0, 0, time.UTC)
	active := ScheduledEvent{ID: "instance-event-0000000000000000a", Code: EventSystemReboot, Description: "The instance is scheduled for a reboot",
		NotBefore: nb, NotAfter: nb.Add(2 * time.Hour), NotBeforeDeadline: nb.Add(72 * time.Hour)}
	done := ScheduledEvent{ID: "instance-event-0000000000000000b", Code: EventInstanceStop, Description: "The instance is scheduled for stop",
		NotBefore: nb.Add(-48 * time.Hour), State: EventStateCompleted}
	for _, ev := range []ScheduledEvent{active, done} {
		if err := s.AddScheduledEvent(idA, ev); err != nil {
			t.Fatal(err)
		}
	}
	out, err := c.DescribeInstanceStatus(t.Context(), &ec2.DescribeInstanceStatusInput{InstanceIds: []string{idA, idB}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.InstanceStatuses) != 2 {
		t.Fatalf("got %d statuses, want 2", len(out.InstanceStatuses))
	}
	var evs []string
	for _, st := range out.InstanceStatuses {
		for _, e := range st.Events {
			evs = append(evs, fmt.Sprintf("%s %s %s %q %s %v %v", aws.ToString(st.InstanceId), aws.ToString(e.InstanceEventId), e.Code,
				aws.ToString(e.Description), aws.ToTime(e.NotBefore).Format(time.RFC3339), e.NotAfter != nil, e.NotBeforeDeadline != nil))
		}
	}
	sort.Strings(evs)
	want := []string{
		idA + ` instance-event-0000000000000000a system-reboot "The instance is scheduled for a reboot" 2026-01-09T09:00:00Z true true`,
		idA + ` instance-event-0000000000000000b instance-stop "[Completed] The instance is scheduled for stop" 2026-01-07T09:00:00Z false false`,
	}
	if strings.Join(evs, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(evs, "\n"), strings.Join(want, "\n"))
	}

	// Stopped instances are described only with IncludeAllInstances.
	out, err = c.DescribeInstanceStatus(t.Context(), &ec2.DescribeInstanceStatusInput{InstanceIds: []string{idC}})
	if err != nil || len(out.InstanceStatuses) != 0 {
		t.Fatalf("stopped without IncludeAllInstances: %v, %d statuses", err, len(out.InstanceStatuses))
	}
	out, err = c.DescribeInstanceStatus(t.Context(), &ec2.DescribeInstanceStatusInput{InstanceIds: []string{idC}, IncludeAllInstances: aws.Bool(true)})
	if err != nil || len(out.InstanceStatuses) != 1 {
		t.Fatalf("stopped with IncludeAllInstances: %v, %d statuses", err, len(out.InstanceStatuses))
	}
}

func TestDescribeInstanceStatusLimits(t *testing.T) {
	s := New(Config{})
	var ids []string
	for i := 0; i < 12; i++ {
		id := fmt.Sprintf("i-%017x", i+1)
		ids = append(ids, id)
		if err := s.AddInstance(Instance{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	c := sdkEC2(t, s)
	var got []string
	p := ec2.NewDescribeInstanceStatusPaginator(c, &ec2.DescribeInstanceStatusInput{MaxResults: aws.Int32(5)})
	pages := 0
	for p.HasMorePages() {
		out, err := p.NextPage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, st := range out.InstanceStatuses {
			got = append(got, aws.ToString(st.InstanceId))
		}
	}
	if pages != 3 || strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("got %d pages %v, want 3 pages %v", pages, got, ids)
	}

	tooMany := make([]string, MaxStatusIDs+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("i-%017x", i+1)
	}
	_, err := c.DescribeInstanceStatus(t.Context(), &ec2.DescribeInstanceStatusInput{InstanceIds: tooMany})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidParameterValue" {
		t.Fatalf("101 IDs: got %v, want InvalidParameterValue", err)
	}
	_, err = c.DescribeInstanceStatus(t.Context(), &ec2.DescribeInstanceStatusInput{InstanceIds: ids[:2], MaxResults: aws.Int32(5)})
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidParameterCombination" {
		t.Fatalf("IDs with MaxResults: got %v, want InvalidParameterCombination", err)
	}
}
