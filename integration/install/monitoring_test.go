package install_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/nodevigil/nodevigil/integration/tools"
)

// promtoolBinary returns a promtool (integration/tools: $PROMTOOL, else one on PATH, else the
// project's cache, else extracted from Debian's prometheus package into it once).
func promtoolBinary(t *testing.T) string {
	t.Helper()
	p, err := tools.Promtool.Path(t.Context())
	if err != nil {
		t.Fatalf("%v\ninstall it (apt-get install prometheus), put it on PATH or set PROMTOOL", err)
	}
	return p
}

// renderedObjects renders the chart with sets and decodes the objects.
func renderedObjects(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := template(t, sets...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", sets, err, out)
	}
	objs, err := decodeManifest([]byte(out), "helm template")
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// findObject returns the one rendered object of kind.
func findObject(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("rendered chart has %d objects of kind %s, want 1", len(found), kind)
	}
	return found[0]
}

// TestPrometheusRules extracts the alerting rules from the rendered chart and runs
// `promtool check rules` and `promtool test rules` on them with testdata/rules_test.yaml:
// each alert fires for its condition and stays silent in the healthy case.
func TestPrometheusRules(t *testing.T) {
	promtool := promtoolBinary(t)
	rule := findObject(t, renderedObjects(t, "metrics.prometheusRule.enabled=true"), "PrometheusRule")
	spec, ok := rule.Object["spec"]
	if !ok {
		t.Fatal("PrometheusRule has no spec")
	}
	rules, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	// promtool check rules reads the rules as rendered; promtool test rules reads them without
	// the descriptions (static prose), so the tests pin the templated summaries only.
	var bare map[string]any
	if err := yaml.Unmarshal(rules, &bare); err != nil {
		t.Fatal(err)
	}
	groups, _ := bare["groups"].([]any)
	for _, g := range groups {
		rs, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rs {
			if a, ok := r.(map[string]any)["annotations"].(map[string]any); ok {
				delete(a, "description")
			}
		}
	}
	bareRules, err := yaml.Marshal(bare)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bare-rules.yaml"), bareRules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	testsBare := strings.Replace(string(tests), "rule_files: [rules.yaml]", "rule_files: [bare-rules.yaml]", 1)
	if testsBare == string(tests) {
		t.Fatal("testdata/rules_test.yaml does not say rule_files: [rules.yaml]")
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), []byte(testsBare), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s\nrules:\n%s", strings.Join(args, " "), err, out, rules)
		}
	}

	// Every alert the chart ships is exercised by the unit tests.
	var rs struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(rules, &rs); err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
				t.Errorf("alert %s has no test in testdata/rules_test.yaml", r.Alert)
			}
			checkMetrics(t, "alert "+r.Alert, r.Expr, exported)
		}
	}

	// "auto" renders the rule only where the cluster serves the CRD.
	if out, err := template(t); err != nil || strings.Contains(out, "kind: PrometheusRule") {
		t.Errorf("default values without the monitoring.coreos.com API rendered a PrometheusRule (err %v)", err)
	}
	out, err := helm(t, "template", "nodevigil", chartRelPath, "--namespace", namespace, "--kube-version", "1.31.0",
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
	if err != nil || !strings.Contains(out, "kind: PrometheusRule") {
		t.Errorf("default values with the monitoring.coreos.com API did not render a PrometheusRule (err %v)", err)
	}
	if out, err := template(t, "metrics.prometheusRule.agentSilentFor=ten minutes"); err == nil || !strings.Contains(out, "agentSilentFor") {
		t.Errorf("a bad duration rendered or failed without naming the value: %v\n%s", err, out)
	}
}

// TestGrafanaDashboard checks the dashboard the chart ships: the ConfigMap holds valid JSON,
// every panel queries something, and every metric a query names is one our binaries export.
func TestGrafanaDashboard(t *testing.T) {
	var cm *unstructured.Unstructured
	for _, o := range renderedObjects(t, "metrics.grafanaDashboard.enabled=true") {
		if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-dashboard") {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("grafanaDashboard.enabled=true rendered no ConfigMap named *-dashboard")
	}
	for _, o := range renderedObjects(t) {
		if strings.HasSuffix(o.GetName(), "-dashboard") {
			t.Errorf("dashboard ConfigMap %s rendered with grafanaDashboard.enabled=false", o.GetName())
		}
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack grafana_dashboard=1 (the sidecar's default)", cm.GetLabels())
	}
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "nodevigil.json")
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.UID == "" {
		t.Error("dashboard has no uid (Grafana would make a new copy on every import)")
	}
	exported := exportedMetrics(t)
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			checkMetrics(t, "panel "+strconv.Quote(p.Title), q.Expr, exported)
		}
	}
	if queries < 10 {
		t.Errorf("dashboard has %d queries; the parse found too little", queries)
	}
}

var metricName = regexp.MustCompile(`\bnodevigil_[a-z0-9_]+`)

// checkMetrics fails when expr names a nodevigil metric no binary exports, or none at all.
func checkMetrics(t *testing.T, what, expr string, exported map[string]bool) {
	t.Helper()
	names := metricName.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s queries no nodevigil metric: %s", what, expr)
	}
	for _, n := range names {
		if !exported[n] {
			t.Errorf("%s queries %s, which no binary exports (exported: %s)", what, n, keys(exported))
		}
	}
}

func keys(m map[string]bool) string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

var (
	exportedOnce sync.Once
	exportedSet  map[string]bool
	exportedErr  error
)

// exportedMetrics parses the registrations in the binaries' packages (agent, collectors,
// remediation): every prometheus.*Opts literal (Namespace, Subsystem and Name joined, constants
// resolved) and every prometheus.NewDesc name, with the _bucket, _sum and _count series of
// histograms and summaries.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	exportedOnce.Do(func() {
		exportedSet = map[string]bool{}
		for _, root := range []string{"../../agent", "../../collectors", "../../remediation"} {
			err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
				if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
					return err
				}
				return parseRegistrations(path, exportedSet)
			})
			if err != nil {
				exportedErr = err
				return
			}
		}
	})
	if exportedErr != nil {
		t.Fatal(exportedErr)
	}
	if len(exportedSet) < 20 {
		t.Fatalf("found only %d exported metrics; the registration parser is broken: %s", len(exportedSet), keys(exportedSet))
	}
	return exportedSet
}

func parseRegistrations(path string, into map[string]bool) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	consts := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := stringLit(vs.Values[i], nil); ok {
						consts[name.Name] = s
					}
				}
			}
		}
		return true
	})
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			sel, ok := n.Type.(*ast.SelectorExpr)
			if !ok || !isPkg(sel.X, "prometheus") || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			var parts [3]string
			for _, el := range n.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, _ := kv.Key.(*ast.Ident)
				v, ok := stringLit(kv.Value, consts)
				if key == nil || !ok {
					continue
				}
				switch key.Name {
				case "Namespace":
					parts[0] = v
				case "Subsystem":
					parts[1] = v
				case "Name":
					parts[2] = v
				}
			}
			if parts[2] == "" {
				return true
			}
			var nonEmpty []string
			for _, p := range parts {
				if p != "" {
					nonEmpty = append(nonEmpty, p)
				}
			}
			addMetric(into, strings.Join(nonEmpty, "_"), sel.Sel.Name)
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if ok && isPkg(sel.X, "prometheus") && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
				if s, ok := stringLit(n.Args[0], consts); ok {
					addMetric(into, s, "")
				}
			}
		}
		return true
	})
	return nil
}

func addMetric(into map[string]bool, name, opts string) {
	into[name] = true
	switch opts {
	case "HistogramOpts":
		into[name+"_bucket"], into[name+"_sum"], into[name+"_count"] = true, true, true
	case "SummaryOpts":
		into[name+"_sum"], into[name+"_count"] = true, true
	}
}

func isPkg(x ast.Expr, name string) bool {
	id, ok := x.(*ast.Ident)
	return ok && id.Name == name
}

// stringLit evaluates a string literal, a constant of the file, or their concatenation.
func stringLit(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[e.Name]
		return s, ok
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok1 := stringLit(e.X, consts)
		b, ok2 := stringLit(e.Y, consts)
		return a + b, ok1 && ok2
	}
	return "", false
}
