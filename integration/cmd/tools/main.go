// Command tools finds or fetches the third-party programs the tests and manifest checks run
// (helm, kustomize, promtool, staticcheck; see package integration/tools) and prints one "name=path" line
// each, in the order asked. CI runs it early, in the background, so that the fetches overlap
// the lint; `make tools` runs it by hand.
//
// Usage: go run ./integration/cmd/tools [helm] [kustomize] [promtool] [staticcheck]
// (default: the first three; `make lint` asks for staticcheck)
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/integration/tools"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	byName := map[string]tools.Tool{}
	for _, t := range tools.Known {
		byName[t.Name] = t
	}
	want := tools.All
	if len(args) > 0 {
		want = nil
		for _, a := range args {
			t, ok := byName[a]
			if !ok {
				fmt.Fprintf(stderr, "tools: unknown tool %q; known: helm, kustomize, promtool, staticcheck\n", a)
				return 2
			}
			want = append(want, t)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	paths := make([]string, len(want))
	errs := make([]error, len(want))
	var wg sync.WaitGroup
	for i, t := range want {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			paths[i], errs[i] = t.Path(ctx)
			fmt.Fprintf(stderr, "tools: %s ready in %s\n", t.Name, time.Since(start).Round(time.Second))
		}()
	}
	wg.Wait()
	code := 0
	for i, t := range want {
		if errs[i] != nil {
			fmt.Fprintf(stderr, "tools: %v\n", errs[i])
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "%s=%s\n", t.Name, paths[i])
	}
	return code
}
