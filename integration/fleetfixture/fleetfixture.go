// Package fleetfixture renders fleets of Nodes, Leases, Events and ConfigMaps described as YAML
// templates whose times are relative to a moment chosen by the caller. The same file then
// serves a unit test at a fixed instant and an end-to-end test that applies it to a real API
// server now, so both judge exactly the same fleet.
//
// Template functions:
//
//	{{ago "10m"}}       RFC 3339 time 10 minutes before now (Node times, annotations, Events)
//	{{agoMicro "4s"}}   RFC 3339 with microseconds (Lease renewTime/acquireTime)
package fleetfixture

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// Render executes the template at path with now and decodes every YAML document into a typed
// object of client-go's scheme, in file order.
func Render(path string, now time.Time) ([]runtime.Object, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fleet: %w", err)
	}
	ago := func(layout string) func(string) (string, error) {
		return func(d string) (string, error) {
			dur, err := time.ParseDuration(d)
			if err != nil {
				return "", fmt.Errorf("ago %q: %w", d, err)
			}
			return now.Add(-dur).UTC().Format(layout), nil
		}
	}
	tmpl, err := template.New(path).Option("missingkey=error").Funcs(template.FuncMap{
		"ago":      ago(time.RFC3339),
		"agoMicro": ago("2006-01-02T15:04:05.000000Z07:00"),
	}).Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parse fleet %s: %w", path, err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, nil); err != nil {
		return nil, fmt.Errorf("render fleet %s: %w", path, err)
	}
	dec := utilyaml.NewYAMLReader(bufio.NewReader(&out))
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("fleet %s document %d: %w", path, i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("fleet %s document %d: %w", path, i, err)
		}
		objs = append(objs, obj)
	}
}
