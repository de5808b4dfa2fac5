// Package ec2 is the remediator's narrow EC2 client: it describes instances and terminates the
// ones that belong to the cluster, over aws-sdk-go-v2 with the SDK's standard retryer.
//
// It exists to put the safety rails of an irreversible action in one small, tested place:
// an instance is only terminated after DescribeInstances has shown that it carries the
// cluster's ownership tag; TerminateInstances is called in batches of at most 1000 IDs; EC2's
// whole-call failures for one unknown ID are split into per-ID outcomes; throttling
// (RequestLimitExceeded) is retried with backoff by the SDK; a missing IAM permission
// (UnauthorizedOperation) is reported as ErrUnauthorized so the caller stops loudly instead of
// retrying forever.
//
// Consumers define their own one- or two-method interface over *Client (or *Batcher).
package ec2

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/nodevigil/nodevigil/remediation/providerid"
	"github.com/prometheus/client_golang/prometheus"
)

// EC2 error codes the client acts on.
const (
	codeThrottled    = "RequestLimitExceeded"
	codeUnauthorized = "UnauthorizedOperation"
	codeNotFound     = "InvalidInstanceID.NotFound"
	codeMalformed    = "InvalidInstanceID.Malformed"
)

const (
	// MaxBatch is the most instance IDs EC2 accepts in one TerminateInstances call.
	MaxBatch = 1000
	// maxDescribeIDs bounds the InstanceId list of one DescribeInstances call, keeping request
	// bodies and the cost of an unknown-ID retry small.
	maxDescribeIDs = 1000

	defaultMaxAttempts = 5
	defaultMaxBackoff  = 20 * time.Second
)

// DefaultClusterTagValues are the values of the ownership tag that mark an instance as the
// cluster's: "owned" (the cluster manages its lifecycle) and "shared" (used by several
// clusters), as the Kubernetes AWS cloud provider defines them.
var DefaultClusterTagValues = []string{"owned", "shared"}

// Sentinel errors, wrapped by the errors this package returns so callers can use errors.Is.
var (
	// ErrUnauthorized means EC2 answered UnauthorizedOperation: the remediator's IAM role lacks
	// a permission. Retrying cannot help; the caller should log loudly and stop for that node.
	ErrUnauthorized = errors.New("ec2: unauthorized operation (check the IAM policy)")
	// ErrNotOwned means the instance lacks the cluster's ownership tag (or has a value not in
	// Config.ClusterTagValues), so it was not terminated.
	ErrNotOwned = errors.New("ec2: instance is not owned by this cluster")
	// ErrNotFound means EC2 did not know the instance ID. Right after a termination this is
	// eventual consistency, not proof that the instance is gone.
	ErrNotFound = errors.New("ec2: instance not found")
	// ErrInvalidInstanceID means an ID is not of the form i-[0-9a-f]{8} or i-[0-9a-f]{17}; it
	// was never sent to EC2.
	ErrInvalidInstanceID = errors.New("ec2: malformed instance ID")
)

// Config configures a Client. Only ClusterTagKey is required (and a region, when the SDK's
// default chain — AWS_REGION, the shared config file — does not supply one).
type Config struct {
	// Region is the AWS region, e.g. "us-east-1". Empty means the SDK's default chain.
	Region string
	// Endpoint overrides the EC2 endpoint URL (an emulator, a VPC endpoint). Empty means the
	// SDK's resolution, which honours AWS_ENDPOINT_URL_EC2 and AWS_ENDPOINT_URL.
	Endpoint string
	// ClusterTagKey is the ownership tag key, e.g. "kubernetes.io/cluster/prod". Required: an
	// instance without it is never terminated.
	ClusterTagKey string
	// ClusterTagValues are the accepted values of ClusterTagKey. Default DefaultClusterTagValues.
	// A tag whose value is empty counts as owned only if "" is listed here explicitly: an empty
	// value is what a half-finished tagging leaves behind, not a statement of ownership.
	ClusterTagValues []string
	// MaxAttempts is the retryer's attempt limit per operation (first try included). Default 5.
	// The SDK's standard retryer also keeps a client-wide retry budget (a token bucket of 500,
	// 5 per retry): under sustained throttling, calls fail fast with a quota error rather than
	// piling retries onto an account EC2 is already throttling. That is intended.
	MaxAttempts int
	// MaxBackoff caps the delay between attempts. Default 20s.
	MaxBackoff time.Duration
	// HTTPClient sends the requests. Default: the SDK's client.
	HTTPClient *http.Client
	// Registerer receives nodevigil_ec2_request_duration_seconds{operation,result} and
	// nodevigil_ec2_requests_total{operation,code}. Nil: metrics are kept but not exported.
	Registerer prometheus.Registerer
	// Logger receives the client's logs. Default: discard.
	Logger *slog.Logger
}

// Client describes and terminates EC2 instances of one cluster. It is safe for concurrent use.
type Client struct {
	api       *ec2.Client
	tagKey    string
	tagValues map[string]bool
	metrics   *metrics
	log       *slog.Logger
}

// New builds a Client from cfg and the SDK's default configuration chain (credentials from
// the environment, shared files, web identity or the instance role).
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.ClusterTagKey == "" {
		return nil, errors.New("ec2: Config.ClusterTagKey is empty: set it to the cluster's ownership tag key, e.g. kubernetes.io/cluster/<cluster-name>")
	}
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("ec2: Config.Endpoint %q is not an http(s) URL, e.g. https://ec2.us-east-1.amazonaws.com", cfg.Endpoint)
		}
	}
	if cfg.MaxAttempts < 0 || cfg.MaxBackoff < 0 {
		return nil, fmt.Errorf("ec2: Config.MaxAttempts (%d) and Config.MaxBackoff (%v) must not be negative", cfg.MaxAttempts, cfg.MaxBackoff)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = defaultMaxAttempts
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = defaultMaxBackoff
	}
	if cfg.ClusterTagValues == nil {
		cfg.ClusterTagValues = DefaultClusterTagValues
	}
	if len(cfg.ClusterTagValues) == 0 {
		return nil, errors.New("ec2: Config.ClusterTagValues is empty: no instance could ever be owned; leave it nil for the defaults")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	maxAttempts, maxBackoff := cfg.MaxAttempts, cfg.MaxBackoff
	opts := []func(*config.LoadOptions) error{
		// The standard retryer treats RequestLimitExceeded as a throttling error (it is in
		// retry.DefaultThrottleErrorCodes; a test keeps it so) and backs off exponentially with
		// jitter. UnauthorizedOperation and InvalidInstanceID.* are not retried.
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = maxAttempts
				o.MaxBackoff = maxBackoff
			})
		}),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(cfg.HTTPClient))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("ec2: load AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("ec2: no AWS region: set Config.Region or AWS_REGION")
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("ec2: register metrics: %w", err)
	}
	api := ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.APIOptions = append(o.APIOptions, m.countAttempts)
		o.HTTPClient = bodyWithoutWriteTo{next: o.HTTPClient}
	})
	values := make(map[string]bool, len(cfg.ClusterTagValues))
	for _, v := range cfg.ClusterTagValues {
		values[v] = true
	}
	return &Client{api: api, tagKey: cfg.ClusterTagKey, tagValues: values, metrics: m, log: log}, nil
}

// Instance is what EC2 says about one instance, reduced to what the remediator decides on.
type Instance struct {
	// ID is the instance ID.
	ID string
	// State is the EC2 state name: pending, running, shutting-down, terminated, stopping, stopped.
	State string
	// Zone is the Availability Zone.
	Zone string
	// Tags are the instance's tags.
	Tags map[string]string
	// Owned reports whether the cluster tag is present with an accepted value.
	Owned bool
	// Lifecycle is EC2's instanceLifecycle: "spot" for a spot instance, empty for on-demand.
	// The remediator checks it before it trusts a spot interruption notice.
	Lifecycle string
}

// TagAutoScalingGroup is the tag EC2 Auto Scaling puts on the instances it launches; the
// remediator checks it before it trusts an ASG termination.
const TagAutoScalingGroup = "aws:autoscaling:groupName"

// Describe returns what EC2 says about ids, keyed by instance ID. IDs EC2 does not know are
// absent from the map, and so are malformed IDs (they are never sent). Because EC2 fails a
// whole DescribeInstances call when one ID is unknown, the call is repeated without the IDs the
// error names (or, if it names none, split in halves until the unknown ones are isolated).
//
// Absence is not proof of termination: EC2 is eventually consistent, and an instance
// terminated moments ago may be missing for a while, or still reported as shutting-down or
// terminated. An error means nothing reliable was learnt; it wraps ErrUnauthorized when the IAM
// policy lacks ec2:DescribeInstances.
func (c *Client) Describe(ctx context.Context, ids []string) (map[string]Instance, error) {
	valid, _ := splitValid(unique(ids))
	out := make(map[string]Instance, len(valid))
	for start := 0; start < len(valid); start += maxDescribeIDs {
		end := min(start+maxDescribeIDs, len(valid))
		if err := c.describeChunk(ctx, valid[start:end], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *Client) describeChunk(ctx context.Context, ids []string, out map[string]Instance) error {
	for len(ids) > 0 {
		found, err := c.describeOnce(ctx, ids)
		if err == nil {
			for id, in := range found {
				out[id] = in
			}
			return nil
		}
		code := apiCode(err)
		if code != codeNotFound && code != codeMalformed {
			return describeError(err)
		}
		bad := namedIDs(ids, err)
		if len(bad) == 0 {
			// The message names no ID we sent: isolate the unknown ones by halving.
			if len(ids) == 1 {
				return nil
			}
			half := len(ids) / 2
			if err := c.describeChunk(ctx, ids[:half], out); err != nil {
				return err
			}
			return c.describeChunk(ctx, ids[half:], out)
		}
		c.log.Debug("ec2 does not know instances, describing the rest", "instance_id", strings.Join(sortedKeys(bad), ","), "reason", code)
		ids = without(ids, bad)
	}
	return nil
}

func describeError(err error) error {
	if apiCode(err) == codeUnauthorized {
		return fmt.Errorf("ec2: describe instances: %w: %w", ErrUnauthorized, err)
	}
	return fmt.Errorf("ec2: describe instances: %w", err)
}

// describeOnce runs one DescribeInstances operation, following NextToken.
func (c *Client) describeOnce(ctx context.Context, ids []string) (map[string]Instance, error) {
	start := time.Now()
	out := make(map[string]Instance, len(ids))
	in := &ec2.DescribeInstancesInput{InstanceIds: ids}
	var err error
	for {
		var page *ec2.DescribeInstancesOutput
		page, err = c.api.DescribeInstances(ctx, in)
		if err != nil {
			break
		}
		for _, r := range page.Reservations {
			for _, inst := range r.Instances {
				i := c.instance(inst)
				out[i.ID] = i
			}
		}
		if aws.ToString(page.NextToken) == "" {
			break
		}
		in.NextToken = page.NextToken
	}
	c.metrics.observe("DescribeInstances", start, err)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *Client) instance(in types.Instance) Instance {
	out := Instance{ID: aws.ToString(in.InstanceId), Lifecycle: string(in.InstanceLifecycle)}
	if in.State != nil {
		out.State = string(in.State.Name)
	}
	if in.Placement != nil {
		out.Zone = aws.ToString(in.Placement.AvailabilityZone)
	}
	if len(in.Tags) > 0 {
		out.Tags = make(map[string]string, len(in.Tags))
		for _, t := range in.Tags {
			out.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
		}
	}
	v, ok := out.Tags[c.tagKey]
	out.Owned = ok && c.tagValues[v]
	return out
}

// Kinds of failure ErrorKind reports. The values are those of remediation.CloudError's Kind,
// so the binary's adapter passes them through unchanged.
const (
	KindThrottled    = "Throttled"
	KindServer       = "ServerError"
	KindTimeout      = "Timeout"
	KindUnauthorized = "Unauthorized"
	KindOther        = "Other"
)

// ErrorKind classifies an error returned by Describe or Terminate (or an Outcome's Err): what
// the caller should do about it. Throttled (RequestLimitExceeded after the retryer gave up),
// ServerError (an HTTP 5xx) and Timeout are transient; Unauthorized is not fixed by retrying.
func ErrorKind(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, ErrUnauthorized) {
		return KindUnauthorized
	}
	switch apiCode(err) {
	case codeThrottled:
		return KindThrottled
	case codeUnauthorized:
		return KindUnauthorized
	}
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return KindServer
	}
	var timeout interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &timeout) && timeout.Timeout()) {
		return KindTimeout
	}
	return KindOther
}

// apiCode returns the EC2 error code carried by err, or "".
func apiCode(err error) string {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode()
	}
	return ""
}

// namedIDs returns the IDs of ids that the message of an InvalidInstanceID.* error names.
// EC2 writes them quoted and comma-separated ("The instance IDs 'i-1, i-2' do not exist",
// `Invalid id: "i-x"`); the message is cut into words and compared exactly, so that the 8-digit
// ID i-01234567 is not mistaken for a prefix of a 17-digit one.
func namedIDs(ids []string, err error) map[string]bool {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return nil
	}
	words := strings.FieldsFunc(apiErr.ErrorMessage(), func(r rune) bool {
		return !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	})
	inMessage := make(map[string]bool, len(words))
	for _, w := range words {
		inMessage[w] = true
	}
	bad := map[string]bool{}
	for _, id := range ids {
		if inMessage[id] {
			bad[id] = true
		}
	}
	return bad
}

func unique(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// splitValid separates well-formed instance IDs from malformed ones, keeping order.
func splitValid(ids []string) (valid, malformed []string) {
	valid = make([]string, 0, len(ids))
	for _, id := range ids {
		if providerid.ValidInstanceID(id) {
			valid = append(valid, id)
		} else {
			malformed = append(malformed, id)
		}
	}
	return valid, malformed
}

func without(ids []string, drop map[string]bool) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if !drop[id] {
			out = append(out, id)
		}
	}
	return out
}
