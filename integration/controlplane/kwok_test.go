package controlplane

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindOrBuildKwok: kwok is taken from the assets directory, else from the cache, and only
// built (with the embedded kwok build module) when neither has it.
func TestFindOrBuildKwok(t *testing.T) {
	tests := []struct {
		name    string
		assets  bool
		cached  bool
		want    string // "assets", "cache", or "" for a build attempt
		wantErr string
	}{
		{name: "assets win", assets: true, cached: true, want: "assets"},
		{name: "cache", cached: true, want: "cache"},
		{name: "missing is built", wantErr: "build kwok " + KwokVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(KubebuilderAssetsEnv, "")
			cache, assets := t.TempDir(), t.TempDir()
			t.Setenv(AssetsEnv, assets)
			if tt.assets {
				fakeBinary(t, assets, "kwok", "kwok version v0.7.0 go1.26.8 (linux/amd64)")
			}
			if tt.cached {
				fakeBinary(t, filepath.Join(cache, kwokComponent.cacheSubdir), "kwok", "kwok version")
			}
			var progress bytes.Buffer
			// A go command that does not exist: any build attempt fails, naming what it built.
			got, err := FindOrBuildKwok(context.Background(), BuildConfig{CacheDir: cache, Progress: &progress, GoBin: "/nonexistent/go"})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want it to contain %q", err, tt.wantErr)
				}
				if !strings.Contains(progress.String(), "building kwok "+KwokVersion) {
					t.Errorf("progress %q does not announce the build", progress.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.Join(cache, kwokComponent.cacheSubdir, "kwok")
			if tt.want == "assets" {
				want = filepath.Join(assets, "kwok")
			}
			if got != want {
				t.Errorf("kwok = %s, want %s", got, want)
			}
		})
	}
}
