package kubelet

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestExtractWords(t *testing.T) {
	tests := []struct {
		in        string
		cunescape bool
		relax     bool
		want      []string
		wantErr   bool
	}{
		{in: "", want: nil},
		{in: "  a  b\tc ", want: []string{"a", "b", "c"}},
		{in: `"ONE=one" 'TWO=two two'`, cunescape: true, want: []string{"ONE=one", "TWO=two two"}},
		// Quotes in the middle of a word group too, and are removed.
		{in: `ONE='one' "TWO='two two' too" THREE=`, cunescape: true, want: []string{"ONE=one", "TWO='two two' too", "THREE="}},
		{in: `--register-with-taints="a=b:NoSchedule" --x`, want: []string{"--register-with-taints=a=b:NoSchedule", "--x"}},
		{in: `a\ b`, want: []string{"a b"}},
		{in: `'a\'b'`, cunescape: true, want: []string{"a'b"}},
		{in: `a\x41\s\tb`, cunescape: true, want: []string{"aA \tb"}},
		{in: `a\x41`, want: []string{"ax41"}},
		{in: `"unbalanced`, wantErr: true},
		{in: `"unbalanced rest`, relax: true, want: []string{"unbalanced rest"}},
	}
	for _, tt := range tests {
		got, err := extractWords(tt.in, tt.cunescape, tt.relax)
		if (err != nil) != tt.wantErr {
			t.Errorf("extractWords(%q) err = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("extractWords(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestSplitLegacy(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: `"ONE=one" 'TWO=two two'`, want: []string{"ONE=one", "TWO=two two"}},
		// systemd.service(5)'s example as systemd < 233 reads it: quotes inside a word stay.
		{in: `ONE='one' "TWO='two two' too" THREE=`, want: []string{"ONE='one'", "TWO='two two' too", "THREE="}},
		{in: `'KUBELET_EXTRA_ARGS=--register-with-taints="a:NoSchedule"'`, want: []string{`KUBELET_EXTRA_ARGS=--register-with-taints="a:NoSchedule"`}},
		{in: `a "b"c d`, want: []string{"a"}, wantErr: true},
		{in: `a\x41 b\"`, want: []string{"aA", `b"`}},
	}
	for _, tt := range tests {
		got, err := splitLegacy(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("splitLegacy(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseEnvFile(t *testing.T) {
	data := "# comment\n" +
		"; another\n" +
		"A=plain value  \n" +
		"B = \"double \\\"quoted\\\" \\$x \\n\" tail\n" +
		"C='single \\n' more\n" +
		"D=--register-with-taints=\"k=v:NoSchedule\"\n" +
		"E=continued \\\nline\n" +
		"1BAD=x\n" +
		"F=\n" +
		"NODEADM_KUBELET_ARGS=--a=1 --b=2"
	want := []envAssignment{
		{key: "A", value: "plain value", line: 3},
		{key: "B", value: `double "quoted" $x \ntail`, line: 4},
		{key: "C", value: `single \nmore`, line: 5},
		{key: "D", value: `--register-with-taints="k=v:NoSchedule"`, line: 6},
		{key: "E", value: "continued line", line: 7},
		{key: "F", value: "", line: 10},
		{key: "NODEADM_KUBELET_ARGS", value: "--a=1 --b=2", line: 11},
	}
	if got := parseEnvFile([]byte(data)); !reflect.DeepEqual(got, want) {
		t.Errorf("parseEnvFile =\n%+v\nwant\n%+v", got, want)
	}
}

func TestParseUnitFile(t *testing.T) {
	data := "[Unit]\nDescription=x\nExecStart=/not/service\n" +
		"[Service]\n" +
		"# comment\n" +
		"ExecStart=/usr/bin/kubelet \\\n" +
		"    --a=1 \\\n" +
		"# a comment inside the continuation is skipped\n" +
		"    $ARGS\n" +
		"Environment = 'X=1'\n" +
		"Path=a\\\\\n" +
		"Next=b\n"
	want := []unitAssignment{
		{key: "ExecStart", value: "/usr/bin/kubelet      --a=1      $ARGS", file: "f", line: 6},
		{key: "Environment", value: "'X=1'", file: "f", line: 10},
		{key: "Path", value: `a\\`, file: "f", line: 11},
		{key: "Next", value: "b", file: "f", line: 12},
	}
	if got := parseUnitFile("f", []byte(data)); !reflect.DeepEqual(got, want) {
		t.Errorf("parseUnitFile =\n%+v\nwant\n%+v", got, want)
	}
}

// writeHost writes files (host path -> content) under a new host root.
func writeHost(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestLoadKubeletUnit(t *testing.T) {
	const al2 = "ID=\"amzn\"\nVERSION_ID=\"2\"\n"
	const al2023 = "ID=\"amzn\"\nVERSION_ID=\"2023\"\n"
	tests := []struct {
		name    string
		files   map[string]string
		want    []string
		wantErr string
	}{
		{
			// systemd.service(5), "Command lines", first example.
			name: "man page: $VAR splits, ${VAR} is one word",
			files: map[string]string{
				"/etc/os-release": al2023,
				"/usr/lib/systemd/system/kubelet.service": "[Service]\nEnvironment=\"ONE=one\" 'TWO=two two'\n" +
					"ExecStart=/bin/echo $ONE $TWO ${TWO}\n",
			},
			want: []string{"/bin/echo", "one", "two", "two", "two two"},
		},
		{
			// The second example, with today's parser: quotes inside an assignment are removed.
			name: "man page: modern Environment= unquotes",
			files: map[string]string{
				"/etc/os-release": al2023,
				"/etc/systemd/system/kubelet.service": "[Service]\nEnvironment=ONE='one' \"TWO='two two' too\" THREE=\n" +
					"ExecStart=/bin/echo ${ONE} ${TWO} ${THREE}\n",
			},
			want: []string{"/bin/echo", "one", "'two two' too", ""},
		},
		{
			// The same on Amazon Linux 2 (systemd 219), as the man page of that era shows.
			name: "man page: legacy Environment= keeps inner quotes",
			files: map[string]string{
				"/etc/os-release": al2,
				"/etc/systemd/system/kubelet.service": "[Service]\nEnvironment=ONE='one' \"TWO='two two' too\" THREE=\n" +
					"ExecStart=/bin/echo ${ONE} ${TWO} ${THREE}\nExecStart=\nExecStart=/bin/echo $ONE $TWO $THREE\n",
			},
			want: []string{"/bin/echo", "one", "two two", "too"},
		},
		{
			name: "drop-ins: /etc hides /usr/lib of the same name, applied by name; EnvironmentFile overrides Environment",
			files: map[string]string{
				"/usr/lib/systemd/system/kubelet.service":             "[Service]\nExecStart=/usr/bin/kubelet $A $B $C $$D\n",
				"/usr/lib/systemd/system/kubelet.service.d/10-a.conf": "[Service]\nEnvironment=A=from-usr\n",
				"/etc/systemd/system/kubelet.service.d/10-a.conf":     "[Service]\nEnvironment=A=from-etc B=env\n",
				"/usr/lib/systemd/system/kubelet.service.d/20-b.conf": "[Service]\nEnvironmentFile=-/etc/missing\nEnvironmentFile=/etc/b.env\n",
				"/etc/b.env": "B=file\nC='c1 c2'\n",
				"/usr/lib/systemd/system/kubelet.service.d/05-first.conf":  "[Service]\nEnvironment=C=early\n",
				"/usr/lib/systemd/system/kubelet.service.d/README":         "not a drop-in",
				"/usr/lib/systemd/system/kubelet.service.d/30-reset.conf~": "[Service]\nExecStart=\n",
			},
			want: []string{"/usr/bin/kubelet", "from-etc", "file", "c1", "c2", "$D"},
		},
		{
			name: "prefixes and @argv0",
			files: map[string]string{
				"/etc/systemd/system/kubelet.service": "[Service]\nExecStart=-@/usr/bin/kubelet kubelet --v=2\n",
			},
			want: []string{"kubelet", "--v=2"},
		},
		{
			name: "unset $VAR vanishes, unset ${VAR} is empty",
			files: map[string]string{
				"/etc/systemd/system/kubelet.service": "[Service]\nExecStart=/usr/bin/kubelet $NOPE --x=${NOPE}\n",
			},
			want: []string{"/usr/bin/kubelet", "--x="},
		},
		{
			name: "required EnvironmentFile missing",
			files: map[string]string{
				"/etc/systemd/system/kubelet.service": "[Service]\nEnvironmentFile=/etc/eks/kubelet/environment\nExecStart=/usr/bin/kubelet $NODEADM_KUBELET_ARGS\n",
			},
			wantErr: "EnvironmentFile=/etc/eks/kubelet/environment does not exist, so systemd refuses to start kubelet.service",
		},
		{
			name:    "no unit",
			files:   map[string]string{"/etc/hostname": "x"},
			wantErr: "unit file not found",
		},
		{
			name: "no ExecStart",
			files: map[string]string{
				"/etc/systemd/system/kubelet.service":                 "[Service]\nExecStart=/usr/bin/kubelet\n",
				"/etc/systemd/system/kubelet.service.d/99-reset.conf": "[Service]\nExecStart=\n",
			},
			wantErr: "has no ExecStart=",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := writeHost(t, tt.files)
			u, err := loadKubeletUnit(root, "kubelet.service")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := u.args(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("argv = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadKubeletUnitMasked(t *testing.T) {
	root := writeHost(t, map[string]string{"/usr/lib/systemd/system/kubelet.service": "[Service]\nExecStart=/usr/bin/kubelet\n"})
	if err := os.MkdirAll(filepath.Join(root, "etc/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(root, "etc/systemd/system/kubelet.service")); err != nil {
		t.Fatal(err)
	}
	if _, err := loadKubeletUnit(root, "kubelet.service"); err == nil || !strings.Contains(err.Error(), "masked") {
		t.Fatalf("err = %v, want masked", err)
	}
}

func TestLoadKubeletUnitOrigins(t *testing.T) {
	u, err := loadKubeletUnit(filepath.Join("testdata", "hosts", "al2-dropin-braced"), "kubelet.service")
	if err != nil {
		t.Fatal(err)
	}
	last := u.argv[len(u.argv)-1]
	want := unitArg{
		value: `--register-with-taints="node.cilium.io/agent-not-ready=true:NoSchedule"`,
		from: origin{file: "/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf", line: 2, directive: "Environment",
			variable: "KUBELET_EXTRA_ARGS", value: `--register-with-taints="node.cilium.io/agent-not-ready=true:NoSchedule"`},
		braced: true,
	}
	if !reflect.DeepEqual(last, want) {
		t.Errorf("last argument = %+v\nwant %+v", last, want)
	}
	if !u.legacy {
		t.Error("Amazon Linux 2 host not detected as systemd < 233")
	}
	if u.exec.file != "/etc/systemd/system/kubelet.service.d/50-custom-exec.conf" || u.exec.line != 4 {
		t.Errorf("exec origin = %+v", u.exec)
	}
}
