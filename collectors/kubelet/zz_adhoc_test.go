package kubelet

import (
	"context"
	"path/filepath"
	"testing"
)

func TestAdhoc(t *testing.T) {
	for _, h := range []string{"al2-dropin-quoted-ok", "al2-dropin-bad-effect", "al2-dropin-braced", "al2-running-removal", "al2-running-ok", "al2023-env-ok", "al2023-env-no-effect", "al2023-no-owned-taint", "al2023-nodeadm-config-bad", "al2023-nodeadm-config-ok", "al2023-env-ok-running", "al2023-no-owned-taint-running"} {
		c, _ := NewConfigCheck(ConfigCheckConfig{HostRoot: filepath.Join("testdata/hosts", h), ExpectedTaints: []string{"node.cilium.io/agent-not-ready"}})
		r := c.Check(context.Background())
		t.Logf("%s: %s/%s\n  %s\n", h, r.Status, r.Reason, r.Message)
	}
}
