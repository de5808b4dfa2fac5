package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var (
	typeOfRemediatorConfig = reflect.TypeFor[RemediatorConfig]()
	typeOfDuration         = reflect.TypeFor[metav1.Duration]()
	typeOfIntOrString      = reflect.TypeFor[intstr.IntOrString]()
)

// checkShape walks a generic decoded document (maps, slices, json.Number, strings, bools)
// against the Go type it will be decoded into and reports, by path, every unknown field and
// every value of the wrong shape. encoding/json reports neither with a path, and an operator
// with forty policies needs to know which one is wrong.
func checkShape(path string, v any, t reflect.Type, errs *[]error) {
	if v == nil {
		// null means "not set"; the default applies.
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	fail := func(format string, args ...any) {
		*errs = append(*errs, fmt.Errorf("%s: %s", name(path), fmt.Sprintf(format, args...)))
	}
	switch t {
	case typeOfDuration:
		s, ok := v.(string)
		if !ok {
			fail("%s is not a duration; write a Go duration string such as 90s, 5m or 1h30m", show(v))
			return
		}
		if _, err := time.ParseDuration(s); err != nil {
			fail("%q is not a duration; write a Go duration string such as 90s, 5m or 1h30m", s)
		}
		return
	case typeOfIntOrString:
		switch x := v.(type) {
		case json.Number:
			if _, err := strconv.ParseInt(x.String(), 10, 32); err != nil {
				fail("%s is not a whole number; write a node count such as 2 or a percentage such as \"20%%\"", x)
			}
		case string:
			if !strings.HasSuffix(x, "%") {
				fail("%q is neither a count nor a percentage; write a node count such as 2 or a percentage such as \"20%%\"", x)
				return
			}
			if _, err := strconv.Atoi(strings.TrimSuffix(x, "%")); err != nil {
				fail("%q is not a whole percentage; write e.g. \"20%%\"", x)
			}
		default:
			fail("%s is neither a count nor a percentage; write a node count such as 2 or a percentage such as \"20%%\"", show(v))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			fail("%s is not a mapping of fields", show(v))
			return
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			f, ok := fields[k]
			if !ok {
				*errs = append(*errs, fmt.Errorf("%s: unknown field; known fields here are %s", join(path, k), knownList(fields)))
				continue
			}
			checkShape(join(path, k), m[k], f.Type, errs)
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			fail("%s is not a mapping", show(v))
			return
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			checkShape(join(path, k), m[k], t.Elem(), errs)
		}
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			fail("%s is not a list", show(v))
			return
		}
		for i, e := range s {
			checkShape(fmt.Sprintf("%s[%d]", path, i), e, t.Elem(), errs)
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			fail("%s is not a string; quote it", show(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			fail("%s is not a boolean; write true or false", show(v))
		}
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			fail("%s is not a number", show(v))
			return
		}
		if _, err := strconv.ParseInt(n.String(), 10, 32); err != nil {
			fail("%s is not a whole number", n)
		}
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			fail("%s is not a number", show(v))
			return
		}
		if _, err := n.Float64(); err != nil {
			fail("%s is not a number", n)
		}
	default:
		fail("cannot be checked (internal error: unexpected kind %s)", t.Kind())
	}
}

func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		out[tag] = f
	}
	return out
}

func knownList(fields map[string]reflect.StructField) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func name(path string) string {
	if path == "" {
		return "document"
	}
	return path
}

func show(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	default:
		return fmt.Sprint(x)
	}
}
