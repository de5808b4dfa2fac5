package ec2emu

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// filter is one Filter.N of a DescribeInstances request: an instance matches when the named
// attribute matches any of the values (values are ORed, filters are ANDed, as in EC2).
type filter struct {
	name   string
	values []string
}

// describeRequest is a parsed DescribeInstances request.
type describeRequest struct {
	ids        []string
	filters    []filter
	maxResults int // 0 when absent
	nextToken  string
}

// apiError is an EC2 error: its code, message and the HTTP status EC2 sends with it.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func errInvalidParameterValue(format string, args ...any) *apiError {
	return &apiError{status: 400, code: "InvalidParameterValue", message: fmt.Sprintf(format, args...)}
}

// indexedList collects the values of the flattened list parameter prefix.N (for example
// InstanceId.1, InstanceId.2), ordered by N. The Query protocol numbers list members from 1;
// gaps are allowed, a non-numeric or non-positive index is an error.
func indexedList(form url.Values, prefix string) ([]string, error) {
	type member struct {
		n     int
		value string
	}
	var members []member
	for key, vals := range form {
		rest, ok := strings.CutPrefix(key, prefix+".")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 {
			return nil, errInvalidParameterValue("parameter %s: the list index must be a positive integer", key)
		}
		if len(vals) > 0 {
			members = append(members, member{n: n, value: vals[0]})
		}
	}
	sort.Slice(members, func(i, j int) bool { return members[i].n < members[j].n })
	out := make([]string, len(members))
	for i, m := range members {
		out[i] = m.value
	}
	return out, nil
}

// instanceIDs returns the InstanceId.N members in order, without duplicates.
func instanceIDs(form url.Values) ([]string, error) {
	ids, err := indexedList(form, "InstanceId")
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// filters parses Filter.N.Name and Filter.N.Value.M.
func filters(form url.Values, known func(string) bool) ([]filter, error) {
	byIndex := map[int]*filter{}
	for key, vals := range form {
		rest, ok := strings.CutPrefix(key, "Filter.")
		if !ok {
			continue
		}
		idx, field, _ := strings.Cut(rest, ".")
		n, err := strconv.Atoi(idx)
		if err != nil || n < 1 {
			return nil, errInvalidParameterValue("parameter %s: the filter index must be a positive integer", key)
		}
		f := byIndex[n]
		if f == nil {
			f = &filter{}
			byIndex[n] = f
		}
		switch {
		case field == "Name":
			if len(vals) > 0 {
				f.name = vals[0]
			}
		case strings.HasPrefix(field, "Value."):
			// Collected below in index order.
		default:
			return nil, &apiError{status: 400, code: "UnknownParameter", message: fmt.Sprintf("The parameter %s is not recognized", key)}
		}
	}
	idx := make([]int, 0, len(byIndex))
	for n := range byIndex {
		idx = append(idx, n)
	}
	sort.Ints(idx)
	out := make([]filter, 0, len(idx))
	for _, n := range idx {
		f := byIndex[n]
		if f.name == "" {
			return nil, &apiError{status: 400, code: "MissingParameter", message: fmt.Sprintf("The request must contain the parameter Filter.%d.Name", n)}
		}
		vals, err := indexedList(form, fmt.Sprintf("Filter.%d.Value", n))
		if err != nil {
			return nil, err
		}
		if !known(f.name) {
			return nil, errInvalidParameterValue("The filter '%s' is invalid", f.name)
		}
		f.values = vals
		out = append(out, *f)
	}
	return out, nil
}

// knownFilter reports whether the emulator implements a filter name. Unimplemented filters are
// rejected rather than ignored, so a test never passes because a filter silently matched all.
func knownFilter(name string) bool {
	switch name {
	case "instance-id", "instance-state-name", "tag-key", "availability-zone":
		return true
	}
	return strings.HasPrefix(name, "tag:") && len(name) > len("tag:")
}

func parseDescribe(form url.Values) (describeRequest, error) {
	var req describeRequest
	var err error
	if req.ids, err = instanceIDs(form); err != nil {
		return req, err
	}
	if req.filters, err = filters(form, knownFilter); err != nil {
		return req, err
	}
	req.maxResults, req.nextToken, err = paging(form, req.ids)
	return req, err
}

// paging parses a Describe call's MaxResults and NextToken as EC2 does: MaxResults between 5
// and 1000, and never together with instance IDs.
func paging(form url.Values, ids []string) (maxResults int, nextToken string, err error) {
	if v := form.Get("MaxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 5 || n > 1000 {
			return 0, "", errInvalidParameterValue("Value ( %s ) for parameter maxResults is invalid. Expecting a value between 5 and 1000.", v)
		}
		if len(ids) > 0 {
			return 0, "", &apiError{status: 400, code: "InvalidParameterCombination", message: "The parameter instancesSet cannot be used with the parameter maxResults"}
		}
		maxResults = n
	}
	return maxResults, form.Get("NextToken"), nil
}

// match reports whether in matches every filter.
func match(in Instance, fs []filter) bool {
	for _, f := range fs {
		if !matchOne(in, f) {
			return false
		}
	}
	return true
}

func matchOne(in Instance, f filter) bool {
	var candidates []string
	switch {
	case f.name == "instance-id":
		candidates = []string{in.ID}
	case f.name == "instance-state-name":
		candidates = []string{in.State}
	case f.name == "availability-zone":
		candidates = []string{in.Zone}
	case f.name == "tag-key":
		for k := range in.Tags {
			candidates = append(candidates, k)
		}
	case strings.HasPrefix(f.name, "tag:"):
		v, ok := in.Tags[strings.TrimPrefix(f.name, "tag:")]
		if !ok {
			return false
		}
		candidates = []string{v}
	}
	for _, c := range candidates {
		for _, pattern := range f.values {
			if wildcard(pattern, c) {
				return true
			}
		}
	}
	return false
}

// wildcard matches s against an EC2 filter value, where * matches any run of characters, ?
// matches exactly one, and a backslash escapes the next character.
func wildcard(pattern, s string) bool {
	p := []rune(pattern)
	r := []rune(s)
	// Classic two-pointer glob match with backtracking to the last star.
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(r) {
		switch {
		case pi < len(p) && p[pi] == '\\' && pi+1 < len(p) && p[pi+1] == r[si]:
			pi += 2
			si++
		case pi < len(p) && p[pi] != '\\' && (p[pi] == '?' || (p[pi] != '*' && p[pi] == r[si])):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
