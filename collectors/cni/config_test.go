package cni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name, file, data string
		want             netConf
		wantErr          string
	}{
		{
			name: "conflist", file: "10-x.conflist",
			data: `{"cniVersion":"0.4.0","name":"x","plugins":[{"type":"aws-cni"},{"type":"portmap","capabilities":{"portMappings":true}}]}`,
			want: netConf{Name: "x", CNIVersion: "0.4.0", Types: []string{"aws-cni", "portmap"}},
		},
		{
			name: "conf", file: "10-x.conf",
			data: `{"cniVersion":"1.0.0","name":"x","type":"bridge","ipam":{"type":"host-local"}}`,
			want: netConf{Name: "x", CNIVersion: "1.0.0", Types: []string{"bridge"}},
		},
		{
			name: "json is a single plugin", file: "x.json",
			data: `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`,
			want: netConf{Name: "cbr0", CNIVersion: "0.3.1", Types: []string{"flannel"}},
		},
		{
			name: "cniVersions instead of cniVersion", file: "x.conflist",
			data: `{"cniVersions":["1.0.0","1.1.0"],"name":"x","plugins":[{"type":"ptp"}]}`,
			want: netConf{Name: "x", CNIVersion: "1.0.0,1.1.0", Types: []string{"ptp"}},
		},
		{
			name: "CNI 1.1 plugins from a directory", file: "x.conflist",
			data: `{"cniVersion":"1.1.0","name":"x","loadOnlyInlinedPlugins":"false"}`,
			want: netConf{Name: "x", CNIVersion: "1.1.0", PluginsFromDir: true},
		},
		{name: "not JSON", file: "x.conflist", data: `{"name":`, wantErr: "not valid JSON"},
		{name: "JSON null", file: "x.conflist", data: `null`, wantErr: "not a JSON object"},
		{name: "JSON array", file: "x.conflist", data: `[]`, wantErr: "not valid JSON"},
		{name: "trailing garbage", file: "x.conflist", data: `{"name":"x"} {}`, wantErr: "not valid JSON"},
		{name: "no name", file: "x.conflist", data: `{"cniVersion":"1.0.0","plugins":[{"type":"a"}]}`, wantErr: `missing "name"`},
		{name: "name not a string", file: "x.conflist", data: `{"name":3}`, wantErr: `"name" is not a string`},
		{name: "no version", file: "x.conflist", data: `{"name":"x","plugins":[{"type":"a"}]}`, wantErr: `missing "cniVersion"`},
		{name: "empty cniVersions", file: "x.conflist", data: `{"name":"x","cniVersions":[""],"plugins":[{"type":"a"}]}`, wantErr: `missing "cniVersion"`},
		{name: "bad cniVersions", file: "x.conflist", data: `{"name":"x","cniVersions":"1.0.0"}`, wantErr: "cniVersions"},
		{name: "empty plugins", file: "x.conflist", data: `{"name":"x","cniVersion":"1.0.0","plugins":[]}`, wantErr: `empty "plugins"`},
		{name: "plugins not a list", file: "x.conflist", data: `{"name":"x","cniVersion":"1.0.0","plugins":{}}`, wantErr: "not a list"},
		{name: "null plugin", file: "x.conflist", data: `{"name":"x","cniVersion":"1.0.0","plugins":[null]}`, wantErr: "plugin 0: not a JSON object"},
		{name: "plugin without type", file: "x.conflist", data: `{"name":"x","cniVersion":"1.0.0","plugins":[{"type":"a"},{}]}`, wantErr: `plugin 1: missing "type"`},
		{name: "type with a path", file: "x.conflist", data: `{"name":"x","cniVersion":"1.0.0","plugins":[{"type":"../../bin/sh"}]}`, wantErr: "not a file name"},
		{name: "type dot-dot", file: "x.conf", data: `{"name":"x","cniVersion":"1.0.0","type":".."}`, wantErr: "not a file name"},
		{name: "inlined only without plugins", file: "x.conflist", data: `{"name":"x","cniVersion":"1.1.0","loadOnlyInlinedPlugins":true}`, wantErr: "loadOnlyInlinedPlugins"},
		{name: "bad bool", file: "x.conflist", data: `{"name":"x","cniVersion":"1.1.0","loadOnlyInlinedPlugins":"yes"}`, wantErr: "not a boolean"},
		{name: "conflist in a .conf", file: "x.conf", data: `{"name":"x","cniVersion":"1.0.0","plugins":[{"type":"a"}]}`, wantErr: "belongs in a .conflist"},
		{name: "other extension", file: "x.yaml", data: `{"name":"x","cniVersion":"1.0.0","type":"a"}`, wantErr: "extension"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConfig(tt.file, []byte(tt.data))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.Name != tt.want.Name || got.CNIVersion != tt.want.CNIVersion ||
				got.PluginsFromDir != tt.want.PluginsFromDir || !slices.Equal(got.Types, tt.want.Types) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// renderConflist writes nc back as a minimal .conflist.
func renderConflist(nc netConf) []byte {
	m := map[string]any{"name": nc.Name, "cniVersion": nc.CNIVersion}
	if !nc.PluginsFromDir {
		plugins := make([]map[string]string, 0, len(nc.Types))
		for _, t := range nc.Types {
			plugins = append(plugins, map[string]string{"type": t})
		}
		m["plugins"] = plugins
	}
	b, _ := json.Marshal(m) // only strings, maps and slices: cannot fail
	return b
}

// FuzzParseConfig checks that parseConfig never panics, that what it accepts is something
// the runtime could run (a name, a version, at least one plugin with a plain file name as
// type, or a CNI 1.1 plugin directory for a .conflist), and that the accepted config survives
// a render/parse round trip unchanged.
func FuzzParseConfig(f *testing.F) {
	f.Add(uint8(0), []byte(`{"cniVersion":"0.4.0","name":"x","plugins":[{"type":"aws-cni"},{"type":"portmap"}]}`))
	f.Add(uint8(1), []byte(`{"cniVersion":"1.0.0","name":"x","type":"bridge"}`))
	f.Add(uint8(2), []byte(`{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`))
	f.Add(uint8(0), []byte(`{"cniVersions":["1.0.0"],"name":"x","loadOnlyInlinedPlugins":"False"}`))
	f.Add(uint8(0), []byte(`{"name":"x","cniVersion":"1","plugins":[null,{"type":"a/b"}]}`))
	f.Add(uint8(1), []byte(`null`))
	files, _ := filepath.Glob("testdata/hosts/*/etc/cni/net.d/*")
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // a directory among the fixtures
		}
		for i, ext := range configExtensions {
			if filepath.Ext(p) == ext {
				f.Add(uint8(i), data)
			}
		}
	}
	f.Fuzz(func(t *testing.T, ext uint8, data []byte) {
		name := "10-fuzz" + configExtensions[int(ext)%len(configExtensions)]
		nc, err := parseConfig(name, data)
		if err != nil {
			return
		}
		if nc.Name == "" || nc.CNIVersion == "" {
			t.Fatalf("accepted %q without name or version: %+v", data, nc)
		}
		if nc.PluginsFromDir {
			if filepath.Ext(name) != ".conflist" || len(nc.Types) != 0 {
				t.Fatalf("plugin directory for %s with types %v", name, nc.Types)
			}
		} else if len(nc.Types) == 0 {
			t.Fatalf("accepted %q with no plugins", data)
		}
		for _, typ := range nc.Types {
			if err := validType(typ); err != nil || filepath.Base(typ) != typ {
				t.Fatalf("accepted plugin type %q: %v", typ, err)
			}
		}
		again, err := parseConfig("10-fuzz.conflist", renderConflist(nc))
		if err != nil {
			t.Fatalf("re-parse of %+v: %v", nc, err)
		}
		if again.Name != nc.Name || again.CNIVersion != nc.CNIVersion ||
			again.PluginsFromDir != nc.PluginsFromDir || !slices.Equal(again.Types, nc.Types) {
			t.Fatalf("round trip changed the config: %+v -> %+v", nc, again)
		}
	})
}
