package clusterenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// Binaries are what a package's tests run, built once by Main before the first test.
type Binaries struct {
	// Plane is the control plane's binaries, set when MainConfig.OwnPlanes asks for them.
	Plane controlplane.Binaries
	// Remediator and Agent are the paths of nodevigil-remediator and nodevigil-agent, built
	// for this run when MainConfig asks for them and removed when it ends.
	Remediator, Agent string
}

// MainConfig says what a package's tests need before they start.
type MainConfig struct {
	// OwnPlanes is for packages whose tests each start a control plane of their own
	// (StartControlPlane): Main finds or builds its binaries into Binaries.Plane.
	OwnPlanes bool
	// SharedPlane, if set, receives one control plane that Main starts for the whole package
	// and stops after the last test (controlplane.RunTests).
	SharedPlane **controlplane.ControlPlane
	// Remediator and Agent build those binaries.
	Remediator, Agent bool
	// Parallel is -test.parallel unless the command line gives it: these tests mostly wait on
	// processes, so more run at once than go test's default (GOMAXPROCS, 2 on CI machines).
	// 0 keeps go test's default.
	Parallel int
}

// Main is the body of TestMain for the packages that run the remediator: it builds what cfg
// asks for into bins, runs the tests and returns the exit code for os.Exit. The set-up is
// here once so that every package builds the same binaries the same way.
func Main(m *testing.M, cfg MainConfig, bins *Binaries) int {
	flag.Parse()
	if cfg.Parallel > 0 && !flagGiven("test.parallel") {
		_ = flag.Set("test.parallel", strconv.Itoa(cfg.Parallel))
	}
	ctx := context.Background()
	if cfg.OwnPlanes {
		plane, err := controlplane.FindOrBuild(ctx, controlplane.BuildConfig{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bins.Plane = plane
	}
	for _, b := range []struct {
		want bool
		pkg  string
		dst  *string
	}{
		{cfg.Remediator, "github.com/nodevigil/nodevigil/remediation/cmd/nodevigil-remediator", &bins.Remediator},
		{cfg.Agent, "github.com/nodevigil/nodevigil/agent/cmd/nodevigil-agent", &bins.Agent},
	} {
		if !b.want {
			continue
		}
		path, cleanup, err := testbin.BuildTemp(ctx, b.pkg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		*b.dst = path
	}
	if cfg.SharedPlane != nil {
		return controlplane.RunTests(m, controlplane.Config{}, cfg.SharedPlane)
	}
	return m.Run()
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
