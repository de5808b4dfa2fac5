package ec2emu

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseDescribe(t *testing.T) {
	tests := []struct {
		name string
		form map[string][]string
		want describeRequest
	}{
		{"empty", map[string][]string{}, describeRequest{ids: []string{}, filters: []filter{}}},
		{
			"ids in index order without duplicates",
			map[string][]string{"InstanceId.10": {"i-c"}, "InstanceId.2": {"i-b"}, "InstanceId.1": {"i-a"}, "InstanceId.3": {"i-a"}},
			describeRequest{ids: []string{"i-a", "i-b", "i-c"}, filters: []filter{}},
		},
		{
			"filters with values in index order",
			map[string][]string{
				"Filter.2.Name": {"tag-key"}, "Filter.2.Value.1": {"k"},
				"Filter.1.Name": {"instance-state-name"}, "Filter.1.Value.2": {"stopped"}, "Filter.1.Value.1": {"running"},
			},
			describeRequest{ids: []string{}, filters: []filter{
				{name: "instance-state-name", values: []string{"running", "stopped"}},
				{name: "tag-key", values: []string{"k"}},
			}},
		},
		{
			"paging",
			map[string][]string{"MaxResults": {"5"}, "NextToken": {"tok"}},
			describeRequest{ids: []string{}, filters: []filter{}, maxResults: 5, nextToken: "tok"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDescribe(tt.form)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseDescribeErrors(t *testing.T) {
	tests := []struct {
		name string
		form map[string][]string
		want string
	}{
		{"zero index", map[string][]string{"InstanceId.0": {"i-a"}}, "InvalidParameterValue"},
		{"bad filter field", map[string][]string{"Filter.1.Nmae": {"x"}}, "UnknownParameter"},
		{"bad filter value index", map[string][]string{"Filter.1.Name": {"tag-key"}, "Filter.1.Value.x": {"k"}}, "InvalidParameterValue"},
		{"empty tag filter", map[string][]string{"Filter.1.Name": {"tag:"}, "Filter.1.Value.1": {"k"}}, "InvalidParameterValue"},
		{"max results too small", map[string][]string{"MaxResults": {"4"}}, "InvalidParameterValue"},
		{"max results not a number", map[string][]string{"MaxResults": {"ten"}}, "InvalidParameterValue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseDescribe(tt.form)
			if err == nil {
				t.Fatal("no error")
			}
			if got := asAPIError(err).code; got != tt.want {
				t.Errorf("code %s, want %s (%v)", got, tt.want, err)
			}
		})
	}
}

func TestWildcard(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"owned", "owned", true},
		{"owned", "owner", false},
		{"own*", "owned", true},
		{"*", "", true},
		{"*ed", "owned", true},
		{"o?ned", "owned", true},
		{"o?ned", "oned", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{`a\*`, "a*", true},
		{`a\*`, "ab", false},
		{`a\?`, "a?", true},
		{"", "", true},
		{"", "x", false},
	}
	for _, tt := range tests {
		if got := wildcard(tt.pattern, tt.s); got != tt.want {
			t.Errorf("wildcard(%q, %q) = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
	}
}

func TestLoadInstances(t *testing.T) {
	want := []Instance{
		{ID: "i-0123456789abcdef0", Zone: "us-east-1a", Tags: map[string]string{"kubernetes.io/cluster/dev": "owned", "Name": "dev-node-a"}},
		{ID: "i-0fedcba9876543210", Zone: "us-east-1b", State: "running", Tags: map[string]string{"kubernetes.io/cluster/dev": "shared"}},
		{ID: "i-01234567", Zone: "us-east-1c", State: "stopped"},
	}
	tests := []struct {
		file    string
		wantErr string
	}{
		{"instances.yaml", ""},
		{"instances.json", ""},
		{"bad_id.yaml", `instances[1]: instance id "i-nothex"`},
		{"duplicate.yaml", "instances[1]: duplicate instance id"},
		{"unknown_field.yaml", "availabilityZone"},
		{"bad_state.yaml", `state "exploded"`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := LoadInstances(f)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}
