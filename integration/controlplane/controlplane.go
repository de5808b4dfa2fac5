// Package controlplane starts a real etcd, kube-apiserver and kube-controller-manager on
// loopback for nodevigil's integration tests, and tears them down again. Everything nodevigil
// does happens through the Kubernetes API, so its tests run against the real thing: real
// admission, RBAC, strategic merge, Ready=Unknown transitions from the node lifecycle
// controller, and owner-reference garbage collection.
//
// One control plane serves one test package (started from TestMain); tests isolate themselves
// with unique names and namespaces.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodevigil/nodevigil/integration/testbin"
)

// Config tunes the control plane. The zero value starts all three components with short grace
// periods suited to tests.
type Config struct {
	// Binaries to run; found or built with FindOrBuild when empty.
	Binaries Binaries
	// Build configures FindOrBuild.
	Build BuildConfig
	// Dir holds data, certificates and logs; a fresh temporary directory when empty. It is
	// removed by Stop only when the harness created it.
	Dir string
	// NodeMonitorGracePeriod is how long a node may go without a kubelet heartbeat before the
	// node lifecycle controller marks it Ready=Unknown. Default 20s (the kubelet default is 50s).
	NodeMonitorGracePeriod time.Duration
	// NodeStartupGracePeriod is the same for nodes that never reported. Default 20s.
	NodeStartupGracePeriod time.Duration
	// NodeMonitorPeriod is how often the node lifecycle controller looks. Default 1s.
	NodeMonitorPeriod time.Duration
	// Controllers run by kube-controller-manager. Default: nodelifecycle, garbagecollector,
	// serviceaccount, namespace. Set DisableControllerManager to run none.
	Controllers []string
	// DisableControllerManager skips kube-controller-manager entirely.
	DisableControllerManager bool
	// StartTimeout bounds each component's readiness wait. Default 60s.
	StartTimeout time.Duration
	// Progress receives start-up progress lines; default os.Stderr.
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.NodeMonitorGracePeriod == 0 {
		c.NodeMonitorGracePeriod = 20 * time.Second
	}
	if c.NodeStartupGracePeriod == 0 {
		c.NodeStartupGracePeriod = 20 * time.Second
	}
	if c.NodeMonitorPeriod == 0 {
		c.NodeMonitorPeriod = time.Second
	}
	if len(c.Controllers) == 0 {
		c.Controllers = []string{"nodelifecycle", "garbagecollector", "serviceaccount", "namespace"}
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.Progress == nil {
		c.Progress = os.Stderr
	}
}

// adminToken is the static bearer token of the system:masters user the harness creates. It
// only ever exists in a test's temporary directory on loopback.
const adminToken = "nodevigil-harness-admin" // #nosec G101 -- loopback test credential

// ControlPlane is a running etcd + kube-apiserver (+ kube-controller-manager).
type ControlPlane struct {
	cfg        Config
	dir        string
	ownDir     bool
	apiPort    int
	caPEM      []byte
	kubeconfig string

	mu   sync.Mutex
	etcd *process
	api  *process
	kcm  *process
}

// Start builds or finds the binaries and starts the control plane. On error nothing is left
// running.
func Start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	cfg.defaults()
	if cfg.Binaries == (Binaries{}) {
		if cfg.Build.Progress == nil {
			cfg.Build.Progress = cfg.Progress
		}
		bins, err := FindOrBuild(ctx, cfg.Build)
		if err != nil {
			return nil, err
		}
		cfg.Binaries = bins
	}
	cp := &ControlPlane{cfg: cfg, dir: cfg.Dir}
	if cp.dir == "" {
		d, err := os.MkdirTemp("", "nodevigil-controlplane-")
		if err != nil {
			return nil, fmt.Errorf("create control-plane dir: %w", err)
		}
		cp.dir, cp.ownDir = d, true
	}
	defer func() {
		if err != nil {
			_ = cp.Stop()
		}
	}()
	if err := cp.writeFiles(); err != nil {
		return nil, err
	}
	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if !cfg.DisableControllerManager {
		if err := cp.startControllerManager(ctx); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

func (cp *ControlPlane) writeFiles() error {
	for _, d := range []string{"etcd", "pki", "kcm-certs", "logs"} {
		if err := os.MkdirAll(filepath.Join(cp.dir, d), 0o700); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	caPEM, certPEM, keyPEM, err := servingCert()
	if err != nil {
		return err
	}
	saPub, saKey, err := serviceAccountKey()
	if err != nil {
		return err
	}
	cp.caPEM = caPEM
	files := map[string][]byte{
		"pki/ca.crt":      caPEM,
		"pki/serving.crt": certPEM,
		"pki/serving.key": keyPEM,
		"pki/sa.pub":      saPub,
		"pki/sa.key":      saKey,
		"pki/tokens.csv":  []byte(adminToken + ",nodevigil-admin,nodevigil-admin,\"system:masters\"\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cp.dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	httpc := &http.Client{Timeout: 2 * time.Second}
	_, err := cp.startOnFreePorts(ctx, 2, &cp.etcd, func(ports []int) *process {
		client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		fmt.Fprintf(cp.cfg.Progress, "controlplane: starting etcd on %s\n", client)
		return &process{
			name: "etcd", path: cp.cfg.Binaries.Etcd, logPath: filepath.Join(cp.dir, "logs", "etcd.log"),
			args: []string{
				"--data-dir", filepath.Join(cp.dir, "etcd"),
				"--listen-client-urls", client, "--advertise-client-urls", client,
				"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
				"--initial-cluster", "default=" + peer,
				"--unsafe-no-fsync", // test data: durability across power loss is not the point
				"--log-level", "warn",
			},
		}
	}, func(ctx context.Context, ports []int) error {
		return getOK(ctx, httpc, "http://127.0.0.1:"+strconv.Itoa(ports[0])+"/health", "")
	})
	return err
}

// portAttempts bounds how often a component is started again on fresh ports after another
// process took one of its ports first.
const portAttempts = 5

// pickPorts chooses the ports of a component; a test replaces it to hand out a taken port.
var pickPorts = freePorts

// startOnFreePorts starts a component that must be told its ports up front: etcd,
// kube-apiserver and kube-controller-manager are not ours and cannot report a port they chose
// (the processes of ours bind port 0 and are asked, testbin.Process.ListenAddr). Between
// pickPorts and the child's bind another process can take a port (another test binary of the
// same `go test -p N`, an outgoing connection's ephemeral port). So the child counts as ready
// only once it holds every port itself (testbin.Listening): a health probe that reached another
// process's etcd on that port is never taken for ours. And when the child exits with "address
// already in use", it is started again on fresh ports. It returns the ports of the run that
// became ready; the process is in *slot from its first start, for Stop.
func (cp *ControlPlane) startOnFreePorts(ctx context.Context, n int, slot **process, mk func(ports []int) *process,
	ready func(ctx context.Context, ports []int) error) ([]int, error) {
	var err error
	for range portAttempts {
		var ports []int
		if ports, err = pickPorts(n); err != nil {
			return nil, err
		}
		p := mk(ports)
		if err := p.start(); err != nil {
			return nil, err
		}
		cp.setProc(slot, p)
		err = p.waitFor(ctx, cp.cfg.StartTimeout, func(ctx context.Context) error {
			if err := holds(p, ports...); err != nil {
				return err
			}
			return ready(ctx, ports)
		})
		if err == nil {
			return ports, nil
		}
		if !p.addressInUse() {
			return nil, err
		}
		_ = p.stop(5 * time.Second)
		fmt.Fprintf(cp.cfg.Progress, "controlplane: %s: another process took a port of %v; starting it again on fresh ports\n", p.name, ports)
	}
	return nil, fmt.Errorf("%d attempts: %w", portAttempts, err)
}

// holds returns nil when the child p itself listens on every port given.
func holds(p *process, ports ...int) error {
	pid := p.pid()
	if pid == 0 {
		return errors.New("not running")
	}
	ok, err := testbin.Listening(pid, ports...)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pid %d does not listen on %v (yet)", pid, ports)
	}
	return nil
}

func (cp *ControlPlane) apiServerArgs(etcdURL string) []string {
	pki := filepath.Join(cp.dir, "pki")
	return []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(cp.apiPort),
		"--cert-dir", filepath.Join(cp.dir, "pki"),
		"--tls-cert-file", filepath.Join(pki, "serving.crt"),
		"--tls-private-key-file", filepath.Join(pki, "serving.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(pki, "sa.key"),
		"--token-auth-file", filepath.Join(pki, "tokens.csv"),
		"--authorization-mode", "Node,RBAC",
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--allow-privileged=true",
		"--endpoint-reconciler-type", "none",
		"--profiling=false",
		"--v", "1",
	}
}

func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	etcdURL := ""
	for i, a := range cp.etcd.args {
		if a == "--advertise-client-urls" {
			etcdURL = cp.etcd.args[i+1]
		}
	}
	httpc, err := cp.httpClient()
	if err != nil {
		return err
	}
	_, err = cp.startOnFreePorts(ctx, 1, &cp.api, func(ports []int) *process {
		cp.apiPort = ports[0]
		fmt.Fprintf(cp.cfg.Progress, "controlplane: starting kube-apiserver on https://127.0.0.1:%d\n", cp.apiPort)
		return &process{
			name: "kube-apiserver", path: cp.cfg.Binaries.APIServer,
			logPath: filepath.Join(cp.dir, "logs", "kube-apiserver.log"),
			args:    cp.apiServerArgs(etcdURL),
		}
	}, func(ctx context.Context, _ []int) error {
		return getOK(ctx, httpc, cp.URL()+"/readyz", adminToken)
	})
	if err != nil {
		return err
	}
	return cp.writeKubeconfig()
}

// waitAPIServer waits for a restarted kube-apiserver: on its old port, since clients know it.
func (cp *ControlPlane) waitAPIServer(ctx context.Context, p *process) error {
	httpc, err := cp.httpClient()
	if err != nil {
		return err
	}
	return p.waitFor(ctx, cp.cfg.StartTimeout, func(ctx context.Context) error {
		if err := holds(p, cp.apiPort); err != nil {
			return err
		}
		return getOK(ctx, httpc, cp.URL()+"/readyz", adminToken)
	})
}

func (cp *ControlPlane) startControllerManager(ctx context.Context) error {
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // #nosec G402 -- self-signed loopback cert of a test process
	}}
	_, err := cp.startOnFreePorts(ctx, 1, &cp.kcm, func(ports []int) *process {
		fmt.Fprintf(cp.cfg.Progress, "controlplane: starting kube-controller-manager (%s)\n", strings.Join(cp.cfg.Controllers, ","))
		return &process{
			name: "kube-controller-manager", path: cp.cfg.Binaries.ControllerManager,
			logPath: filepath.Join(cp.dir, "logs", "kube-controller-manager.log"),
			args: []string{
				"--kubeconfig", cp.kubeconfig,
				"--authentication-kubeconfig", cp.kubeconfig,
				"--authorization-kubeconfig", cp.kubeconfig,
				"--controllers", strings.Join(cp.cfg.Controllers, ","),
				"--node-monitor-grace-period", cp.cfg.NodeMonitorGracePeriod.String(),
				"--node-startup-grace-period", cp.cfg.NodeStartupGracePeriod.String(),
				"--node-monitor-period", cp.cfg.NodeMonitorPeriod.String(),
				"--leader-elect=false",
				"--bind-address", "127.0.0.1",
				"--secure-port", strconv.Itoa(ports[0]),
				"--cert-dir", filepath.Join(cp.dir, "kcm-certs"),
				"--use-service-account-credentials=false",
				"--v", "1",
			},
		}
	}, func(ctx context.Context, ports []int) error {
		return getOK(ctx, insecure, "https://127.0.0.1:"+strconv.Itoa(ports[0])+"/healthz", "")
	})
	return err
}

func (cp *ControlPlane) setProc(slot **process, p *process) {
	cp.mu.Lock()
	*slot = p
	cp.mu.Unlock()
}

func (cp *ControlPlane) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["nodevigil"] = &clientcmdapi.Cluster{Server: cp.URL(), CertificateAuthorityData: cp.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: adminToken}
	cfg.Contexts["nodevigil"] = &clientcmdapi.Context{Cluster: "nodevigil", AuthInfo: "admin"}
	cfg.CurrentContext = "nodevigil"
	path := filepath.Join(cp.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	cp.kubeconfig = path
	return nil
}

// URL is the API server's address.
func (cp *ControlPlane) URL() string { return "https://127.0.0.1:" + strconv.Itoa(cp.apiPort) }

// Dir is the control plane's working directory (data, certificates, logs).
func (cp *ControlPlane) Dir() string { return cp.dir }

// KubeconfigPath is an admin kubeconfig file, for the binaries under test and for kubectl.
func (cp *ControlPlane) KubeconfigPath() string { return cp.kubeconfig }

// Config returns a new admin (system:masters) client config.
func (cp *ControlPlane) Config() *rest.Config {
	return &rest.Config{
		Host:            cp.URL(),
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS:             100,
		Burst:           200,
	}
}

// Client returns an admin clientset.
func (cp *ControlPlane) Client() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cp.Config())
}

// TokenOptions shape a ServiceAccount token.
type TokenOptions struct {
	// BoundPod binds the token to this pod (in the ServiceAccount's namespace). When the pod
	// has spec.nodeName, the apiserver adds the node name to the token's user extra, which the
	// agent's admission policy checks.
	BoundPod *corev1.Pod
	// Expiration defaults to one hour.
	Expiration time.Duration
}

// ServiceAccountConfig returns a client config that authenticates as the ServiceAccount
// namespace/name (created when missing) through a TokenRequest, so RBAC and admission apply to
// it exactly as they would in a pod.
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, namespace, name string, opts TokenOptions) (*rest.Config, error) {
	client, err := cp.Client()
	if err != nil {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create service account %s/%s: %w", namespace, name, err)
	}
	exp := int64(3600)
	if opts.Expiration > 0 {
		exp = int64(opts.Expiration.Seconds())
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	if opts.BoundPod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: opts.BoundPod.Name, UID: opts.BoundPod.UID,
		}
	}
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("request token for %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config())
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after a grace period), leaving etcd
// and the controller manager running: what a client sees during an API outage.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	p := cp.api
	cp.mu.Unlock()
	if p == nil {
		return errors.New("kube-apiserver is not running")
	}
	return p.stop(5 * time.Second)
}

// StartAPIServer starts kube-apiserver again on the same port and waits for it to be ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	p := cp.api
	cp.mu.Unlock()
	if p == nil {
		return errors.New("kube-apiserver was never started")
	}
	if exited, _ := p.exited(); !exited {
		return errors.New("kube-apiserver is already running")
	}
	if err := p.start(); err != nil {
		return err
	}
	return cp.waitAPIServer(ctx, p)
}

// Pids returns the pids of the running children, for tests that prove teardown.
func (cp *ControlPlane) Pids() []int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var pids []int
	for _, p := range []*process{cp.etcd, cp.api, cp.kcm} {
		if p != nil {
			if pid := p.pid(); pid != 0 {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// LogTail returns the last n lines of a component's log ("etcd", "kube-apiserver",
// "kube-controller-manager"), for failure messages.
func (cp *ControlPlane) LogTail(component string, n int) string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, p := range []*process{cp.etcd, cp.api, cp.kcm} {
		if p != nil && p.name == component {
			return p.logTail(n)
		}
	}
	return ""
}

// Stop stops the controller manager, then the apiserver, then etcd — in that order, since an
// apiserver whose etcd is gone waits for storage during shutdown — and removes the working
// directory when the harness created it. It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	procs := []*process{cp.kcm, cp.api, cp.etcd}
	cp.mu.Unlock()
	var errs []error
	for _, p := range procs {
		if p != nil {
			if err := p.stop(5 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if cp.ownDir && os.Getenv("NODEVIGIL_KEEP_CONTROL_PLANE_DIR") == "" {
		if err := os.RemoveAll(cp.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", cp.dir, err))
		}
	}
	return errors.Join(errs...)
}

// Namespace creates a uniquely named namespace for one test and returns its name.
func (cp *ControlPlane) Namespace(ctx context.Context, prefix string) (string, error) {
	client, err := cp.Client()
	if err != nil {
		return "", err
	}
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create namespace: %w", err)
	}
	return ns.Name, nil
}

func (cp *ControlPlane) httpClient() (*http.Client, error) {
	tc, err := rest.TLSConfigFor(cp.Config())
	if err != nil {
		return nil, fmt.Errorf("tls config: %w", err)
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}, nil
}

func getOK(ctx context.Context, c *http.Client, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// freePorts asks the kernel for n free loopback ports. Another process can take one between
// closing the probe listener and the child's bind: startOnFreePorts deals with that.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
