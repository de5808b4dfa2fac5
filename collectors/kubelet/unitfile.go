package kubelet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/nodevigil/nodevigil/collectors/hostfile"
)

// This file rebuilds the kubelet's command line from its systemd unit files, the way systemd
// would when it starts the unit. It exists because a kubelet whose --register-with-taints is
// malformed exits at once: on exactly the nodes this check is for there is no process whose
// command line could be read, only the files that produced it.
//
// What is modelled (systemd.unit(5), systemd.service(5), systemd.exec(5), systemd.syntax(7)):
//   - the unit search path, the first kubelet.service found wins; a unit linked to /dev/null
//     is masked;
//   - drop-ins kubelet.service.d/*.conf from every search directory, a file name in a
//     higher-priority directory hiding the same name below it, applied in file-name order;
//   - line continuations (a trailing backslash), comments (# and ;), the [Service] section;
//   - ExecStart= (an empty assignment resets it; the last one is used), its prefixes
//     (-, @, :, +, !, !!), "%%" specifiers, C escapes and quotes;
//   - Environment= (quoted assignments, C escapes, an empty assignment resets) and
//     EnvironmentFile= ("-" ignores a missing file; glob patterns; later files and
//     EnvironmentFile= as a whole override Environment=), parsed by systemd's env-file
//     state machine (src/basic/env-file.c);
//   - in ExecStart, "$VAR" as a word of its own is replaced by the value split at whitespace
//     with quotes respected and removed, "${VAR}" is replaced verbatim inside its word
//     (always one argument), "$$" is a literal "$" (src/basic/env-util.c replace_env_argv).

// unitSearchDirs is systemd's system unit search path, highest priority first, relative to
// the host root (systemd-analyze unit-paths on Amazon Linux 2 and 2023).
var unitSearchDirs = []string{
	"etc/systemd/system.control",
	"run/systemd/system.control",
	"run/systemd/transient",
	"etc/systemd/system",
	"run/systemd/system",
	"usr/local/lib/systemd/system",
	"usr/lib/systemd/system",
	"lib/systemd/system",
}

// maxUnitFileBytes bounds what is read of one unit, drop-in or environment file.
const maxUnitFileBytes = 1 << 20

// origin says where a word of the rebuilt command line came from, so a message can name the
// file and line to edit.
type origin struct {
	// file is the host path ("/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf").
	file string
	// line is the 1-based line of the assignment (its first line when continued).
	line int
	// directive is "ExecStart", "Environment" or "EnvironmentFile".
	directive string
	// variable is set when the word came from expanding $variable or ${variable}.
	variable string
	// value is the variable's value, before splitting.
	value string
}

// unitArg is one argument of the rebuilt command line.
type unitArg struct {
	value string
	from  origin
	// braced is set when the argument holds a ${VAR} substituted verbatim (quotes and
	// whitespace included) rather than a word split out of $VAR.
	braced bool
}

// kubeletUnit is what systemd would run for the kubelet.
type kubeletUnit struct {
	// name is the unit name ("kubelet.service").
	name string
	// files are the host paths read, unit file first, then drop-ins in order.
	files []string
	// argv is the command line after environment expansion; argv[0] is the program.
	argv []unitArg
	// env is the environment systemd would pass, with origins.
	env map[string]envVar
	// exec is where the ExecStart= in use was written.
	exec origin
	// legacy is set when the host's systemd parses units with the pre-233 rules.
	legacy bool
}

// args returns the rebuilt command line as plain strings.
func (u *kubeletUnit) args() []string {
	out := make([]string, len(u.argv))
	for i, a := range u.argv {
		out[i] = a.value
	}
	return out
}

// errUnitNotFound is returned when no unit file exists on the search path.
var errUnitNotFound = errors.New("unit file not found")

// unitAssignment is one key=value line of a unit file's [Service] section.
type unitAssignment struct {
	key, value string
	file       string
	line       int
}

// envVar is one environment variable with where it was set.
type envVar struct {
	value string
	from  origin
}

// legacySystemd reports whether the host runs a systemd older than 233 (Amazon Linux 2 has
// 219), whose unit parser splits Environment= and ExecStart= values with the older
// FOREACH_WORD_QUOTED rules (see splitLegacy) rather than extract_first_word. It is told by
// /etc/os-release (Amazon Linux 2, RHEL/CentOS 7) or, failing that, by the version in the
// name of libsystemd-shared-<N>.so, which systemd ships since 231.
func legacySystemd(hostRoot string) bool {
	if data, err := os.ReadFile(filepath.Join(hostRoot, "etc", "os-release")); err == nil {
		var id, version string
		for _, kv := range parseEnvFile(data) {
			switch kv.key {
			case "ID":
				id = kv.value
			case "VERSION_ID":
				version = kv.value
			}
		}
		switch {
		case id == "amzn" && version == "2",
			(id == "centos" || id == "rhel") && strings.HasPrefix(version, "7"):
			return true
		case id != "":
			return false
		}
	}
	for _, dir := range []string{"usr/lib/systemd", "lib/systemd", "usr/lib64/systemd"} {
		matches, _ := filepath.Glob(filepath.Join(hostRoot, dir, "libsystemd-shared-*.so"))
		for _, m := range matches {
			v := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "libsystemd-shared-"), ".so")
			if n, err := strconv.Atoi(v); err == nil {
				return n < 233
			}
		}
	}
	return false
}

// loadKubeletUnit reads unit (e.g. "kubelet.service") and its drop-ins under hostRoot and
// rebuilds the command line of its ExecStart.
func loadKubeletUnit(hostRoot, unit string) (*kubeletUnit, error) {
	u := &kubeletUnit{name: unit, legacy: legacySystemd(hostRoot)}
	split := func(s string) ([]string, error) { return extractWords(s, true, false) }
	if u.legacy {
		split = splitLegacy
	}
	var assigns []unitAssignment
	main := ""
	for _, dir := range unitSearchDirs {
		p := "/" + path.Join(dir, unit)
		full := filepath.Join(hostRoot, filepath.FromSlash(p))
		target, err := os.Readlink(full)
		if err == nil && (target == "/dev/null" || target == "../../../dev/null") {
			return nil, fmt.Errorf("%s is masked (%s links to /dev/null)", unit, p)
		}
		if _, err := os.Stat(full); err == nil {
			main = p
			break
		} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errNotDir) {
			return nil, fmt.Errorf("stat %s: %w", full, err)
		}
	}
	if main == "" {
		return nil, fmt.Errorf("%w: no %s in %s under %s", errUnitNotFound, unit, strings.Join(unitSearchDirs, ", "), hostRoot)
	}
	a, err := readUnitFile(hostRoot, main)
	if err != nil {
		return nil, err
	}
	u.files = append(u.files, main)
	assigns = append(assigns, a...)

	dropins, err := findDropins(hostRoot, unit)
	if err != nil {
		return nil, err
	}
	for _, p := range dropins {
		a, err := readUnitFile(hostRoot, p)
		if err != nil {
			return nil, err
		}
		u.files = append(u.files, p)
		assigns = append(assigns, a...)
	}

	var (
		exec     *unitAssignment
		env      = map[string]envVar{}
		envOrder []unitAssignment // Environment= assignments, in order
		envFiles []unitAssignment
	)
	for i := range assigns {
		a := assigns[i]
		switch a.key {
		case "ExecStart":
			if a.value == "" {
				exec = nil
			} else {
				exec = &assigns[i]
			}
		case "Environment":
			if a.value == "" {
				envOrder = nil
			} else {
				envOrder = append(envOrder, a)
			}
		case "EnvironmentFile":
			if a.value == "" {
				envFiles = nil
			} else {
				envFiles = append(envFiles, a)
			}
		}
	}
	if exec == nil {
		return nil, fmt.Errorf("%s has no ExecStart= (read %s)", unit, strings.Join(u.files, ", "))
	}
	for _, a := range envOrder {
		words, err := split(expandSpecifiers(a.value))
		if err != nil && !u.legacy {
			continue // systemd logs "Invalid syntax, ignoring" and skips the line
		}
		for _, w := range words {
			name, value, ok := strings.Cut(w, "=")
			if !ok || !validEnvName(name) {
				continue // systemd ignores invalid assignments
			}
			env[name] = envVar{value: value, from: origin{file: a.file, line: a.line, directive: "Environment", variable: name, value: value}}
		}
	}
	for _, a := range envFiles {
		spec := expandSpecifiers(a.value)
		optional := strings.HasPrefix(spec, "-")
		spec = strings.TrimPrefix(spec, "-")
		files, err := globHost(hostRoot, spec)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: EnvironmentFile=%s: %w", a.file, a.line, a.value, err)
		}
		if len(files) == 0 {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s:%d: EnvironmentFile=%s does not exist, so systemd refuses to start %s (prefix the path with '-' if it is optional)", a.file, a.line, spec, unit)
		}
		for _, f := range files {
			data, err := readHostFile(hostRoot, f)
			if err != nil {
				if optional && errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return nil, err
			}
			for _, kv := range parseEnvFile(data) {
				env[kv.key] = envVar{value: kv.value, from: origin{file: f, line: kv.line, directive: "EnvironmentFile", variable: kv.key, value: kv.value}}
			}
		}
	}

	cmd := strings.TrimLeft(expandSpecifiers(exec.value), " \t")
	prefixes := ""
	for len(cmd) > 0 && strings.ContainsRune("-@:+!", rune(cmd[0])) {
		prefixes += cmd[:1]
		cmd = cmd[1:]
	}
	words, err := split(cmd)
	if err != nil && u.legacy && len(words) > 0 {
		err = nil // the old parser keeps the words before trailing garbage
	}
	if err != nil || len(words) == 0 {
		return nil, fmt.Errorf("%s:%d: ExecStart= cannot be parsed: %v", exec.file, exec.line, err)
	}
	if strings.Contains(prefixes, "@") && len(words) > 1 {
		words = words[1:] // "@": the second word is argv[0]
	}
	execFrom := origin{file: exec.file, line: exec.line, directive: "ExecStart"}
	u.env, u.exec = env, execFrom
	if strings.Contains(prefixes, ":") {
		for _, w := range words { // ":": no environment expansion
			u.argv = append(u.argv, unitArg{value: w, from: execFrom})
		}
		return u, nil
	}
	u.argv = expandArgv(words, env, execFrom)
	return u, nil
}

// findDropins lists <dir>/<unit>.d/*.conf over the search path; a name found in a
// higher-priority directory hides the same name below, and all are applied sorted by name.
func findDropins(hostRoot, unit string) ([]string, error) {
	byName := map[string]string{}
	for _, dir := range unitSearchDirs {
		d := "/" + path.Join(dir, unit+".d")
		entries, err := os.ReadDir(filepath.Join(hostRoot, filepath.FromSlash(d)))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotDir) {
				continue
			}
			return nil, fmt.Errorf("read %s: %w", d, err)
		}
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") {
				continue
			}
			if _, ok := byName[e.Name()]; !ok {
				byName[e.Name()] = d + "/" + e.Name()
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, n := range names {
		p := byName[n]
		// A drop-in linked to /dev/null is masked: it contributes nothing.
		if t, err := os.Readlink(filepath.Join(hostRoot, filepath.FromSlash(p))); err == nil && t == "/dev/null" {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// errNotDir is returned when a path component is a file where a directory was expected.
var errNotDir error = syscall.ENOTDIR

// readHostFile reads a host path (absolute, as on the host) under hostRoot, bounded.
func readHostFile(hostRoot, p string) ([]byte, error) {
	data, err := hostfile.Read(filepath.Join(hostRoot, filepath.FromSlash(p)), nil, maxUnitFileBytes)
	if errors.Is(err, hostfile.ErrTooLarge) {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, maxUnitFileBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return data, nil
}

// globHost expands an EnvironmentFile= pattern (an absolute host path, possibly with glob
// characters) to the matching host paths, sorted.
func globHost(hostRoot, pattern string) ([]string, error) {
	if !path.IsAbs(pattern) {
		return nil, fmt.Errorf("path %q is not absolute", pattern)
	}
	if !strings.ContainsAny(pattern, "*?[") {
		if _, err := os.Stat(filepath.Join(hostRoot, filepath.FromSlash(pattern))); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return nil, err
		}
		return []string{pattern}, nil
	}
	matches, err := filepath.Glob(filepath.Join(hostRoot, filepath.FromSlash(pattern)))
	if err != nil {
		return nil, err
	}
	root := filepath.Clean(hostRoot)
	out := make([]string, 0, len(matches))
	for _, m := range matches {
		rel, err := filepath.Rel(root, m)
		if err != nil {
			continue
		}
		out = append(out, "/"+filepath.ToSlash(rel))
	}
	sort.Strings(out)
	return out, nil
}

// readUnitFile returns the [Service] assignments of one unit file or drop-in.
func readUnitFile(hostRoot, p string) ([]unitAssignment, error) {
	data, err := readHostFile(hostRoot, p)
	if err != nil {
		return nil, err
	}
	return parseUnitFile(p, data), nil
}

// parseUnitFile splits a unit file into the assignments of its [Service] section, joining
// continuation lines as systemd's config parser does: a line ending in a backslash continues
// on the next one, the backslash replaced by a space; comment lines inside a continuation
// are skipped.
func parseUnitFile(name string, data []byte) []unitAssignment {
	var (
		out      []unitAssignment
		section  string
		cont     strings.Builder
		contLine int
	)
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	for i, raw := range lines {
		line := strings.TrimRight(raw, "\r")
		if cont.Len() > 0 {
			if t := strings.TrimLeft(line, " \t"); strings.HasPrefix(t, "#") || strings.HasPrefix(t, ";") {
				continue
			}
		}
		if isContinuation(line) {
			if cont.Len() == 0 {
				contLine = i + 1
			}
			cont.WriteString(line[:len(line)-1])
			cont.WriteByte(' ')
			continue
		}
		start := i + 1
		if cont.Len() > 0 {
			cont.WriteString(line)
			line = cont.String()
			cont.Reset()
			start = contLine
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "", line[0] == '#', line[0] == ';':
			continue
		case line[0] == '[':
			section = strings.TrimSuffix(strings.TrimPrefix(line, "["), "]")
			continue
		}
		if section != "Service" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		out = append(out, unitAssignment{key: strings.TrimSpace(key), value: strings.TrimSpace(value), file: name, line: start})
	}
	return out
}

// isContinuation reports whether a line ends in an escaping backslash: an odd run of
// trailing backslashes (systemd's parser toggles "escaped" over the whole line).
func isContinuation(line string) bool {
	n := len(line) - len(strings.TrimRight(line, "\\"))
	return n%2 == 1
}

// expandSpecifiers resolves "%%" to "%". Other specifiers (%n, %i, ...) do not appear in
// kubelet units and are left as they are.
func expandSpecifiers(s string) string { return strings.ReplaceAll(s, "%%", "%") }

// validEnvName reports whether name is a variable name systemd accepts in an assignment.
func validEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// extractWords splits s into words as systemd's extract_first_word does with
// EXTRACT_UNQUOTE (and EXTRACT_CUNESCAPE when cunescape): whitespace separates words,
// single and double quotes group and are removed, a backslash escapes the next character
// (C escapes such as \n, \t, \x41 and \s when cunescape) inside and outside quotes. An
// unterminated quote is an error unless relax is set, in which case the word ends at the
// end of the input.
func extractWords(s string, cunescape, relax bool) ([]string, error) {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool
		quote   byte
		escaped bool
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if escaped {
			escaped = false
			inWord = true
			if cunescape {
				n, r := cUnescape(s[i:])
				cur.WriteString(r)
				i += n - 1
			} else {
				cur.WriteByte(c)
			}
			continue
		}
		if quote != 0 {
			switch c {
			case quote:
				quote = 0
			case '\\':
				escaped = true
			default:
				cur.WriteByte(c)
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case '\'', '"':
			quote, inWord = c, true
		case '\\':
			escaped, inWord = true, true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if (quote != 0 || escaped) && !relax {
		return nil, errors.New("unbalanced quoting")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// splitLegacy splits a value as systemd before 233 did for Environment= and ExecStart=
// (FOREACH_WORD_QUOTED, then cunescape of each word): a word that starts with a quote runs
// to the matching unescaped quote, which must be followed by whitespace or the end
// (otherwise parsing stops: "Trailing garbage, ignoring"), and loses its quotes; any other
// word runs to the next unescaped whitespace and keeps quote characters inside it
// literally. It returns the words before any garbage, with an error if there was some.
func splitLegacy(s string) ([]string, error) {
	var words []string
	isSep := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	i := 0
	for {
		for i < len(s) && isSep(s[i]) {
			i++
		}
		if i >= len(s) {
			return words, nil
		}
		var raw string
		if q := s[i]; q == '\'' || q == '"' {
			j := i + 1
			for j < len(s) && s[j] != q {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				j++
			}
			if j >= len(s) || j+1 < len(s) && !isSep(s[j+1]) {
				return words, errors.New("trailing garbage")
			}
			raw, i = s[i+1:j], j+1
		} else {
			j := i
			for j < len(s) && !isSep(s[j]) {
				if s[j] == '\\' {
					if j+1 >= len(s) {
						return words, errors.New("unfinished escape")
					}
					j++
				}
				j++
			}
			raw, i = s[i:j], j
		}
		words = append(words, cUnescapeAll(raw))
	}
}

// cUnescapeAll decodes every C escape in s.
func cUnescapeAll(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		n, r := cUnescape(s[i+1:])
		b.WriteString(r)
		i += n
	}
	return b.String()
}

// cUnescape decodes the C escape at the start of s (the character after the backslash),
// returning how many bytes it used and what it stands for. Unknown escapes keep the
// backslash, as systemd's relaxed unescaping does.
func cUnescape(s string) (int, string) {
	switch s[0] {
	case 'a':
		return 1, "\a"
	case 'b':
		return 1, "\b"
	case 'f':
		return 1, "\f"
	case 'n':
		return 1, "\n"
	case 'r':
		return 1, "\r"
	case 't':
		return 1, "\t"
	case 'v':
		return 1, "\v"
	case 's':
		return 1, " "
	case '\\', '"', '\'', ' ':
		return 1, s[:1]
	case 'x':
		if len(s) >= 3 {
			if v, err := strconv.ParseUint(s[1:3], 16, 8); err == nil && v != 0 {
				return 3, string([]byte{byte(v)})
			}
		}
	case '0', '1', '2', '3':
		if len(s) >= 3 {
			if v, err := strconv.ParseUint(s[:3], 8, 8); err == nil && v != 0 {
				return 3, string([]byte{byte(v)})
			}
		}
	}
	return 1, "\\" + s[:1]
}

// expandArgv applies systemd's replace_env_argv to the words of ExecStart.
func expandArgv(words []string, env map[string]envVar, execFrom origin) []unitArg {
	var out []unitArg
	for _, w := range words {
		if len(w) > 1 && w[0] == '$' && w[1] != '{' && w[1] != '$' {
			v, ok := env[w[1:]]
			if !ok {
				continue // an unset $VAR expands to no argument at all
			}
			parts, _ := extractWords(v.value, false, true)
			for _, p := range parts {
				out = append(out, unitArg{value: p, from: v.from})
			}
			continue
		}
		value, from := replaceEnv(w, env)
		braced := from.file != ""
		if !braced {
			from = execFrom
		}
		out = append(out, unitArg{value: value, from: from, braced: braced})
	}
	return out
}

// replaceEnv replaces ${VAR} (unset: empty) and $$ (a literal $) inside one word. The
// origin returned is that of the last variable substituted, or zero when none was.
func replaceEnv(w string, env map[string]envVar) (string, origin) {
	if !strings.Contains(w, "$") {
		return w, origin{}
	}
	var (
		b    strings.Builder
		from origin
	)
	for i := 0; i < len(w); i++ {
		if w[i] != '$' || i+1 >= len(w) {
			b.WriteByte(w[i])
			continue
		}
		switch w[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '{':
			end := strings.IndexByte(w[i+2:], '}')
			if end < 0 {
				b.WriteString(w[i:])
				return b.String(), from
			}
			name := w[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v.value)
				from = v.from
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), from
}

// envAssignment is one KEY=VALUE of an environment file.
type envAssignment struct {
	key, value string
	line       int
}

// parseEnvFile parses an EnvironmentFile= as systemd's parse_env_file_internal does: KEY=VALUE
// lines, '#' and ';' comments, whitespace around the key and trailing whitespace of an
// unquoted value dropped; inside an unquoted value quotes are literal and a backslash escapes
// the next character (an escaped newline continues the line); a value may start with a
// single-quoted (literal) or double-quoted (\" \\ \` \$ unescaped) part, after which more
// parts may follow. Lines whose key is not a valid name are ignored, like systemd does.
func parseEnvFile(data []byte) []envAssignment {
	const (
		preKey = iota
		key
		preValue
		value
		valueEscape
		singleQuote
		doubleQuote
		doubleQuoteEscape
		comment
		commentEscape
	)
	var (
		out        []envAssignment
		state      = preKey
		k, v       strings.Builder
		line       = 1
		startLine  int
		lastValWS  = -1
		lastKeyWS  = -1
		push       func()
		isNL       = func(c byte) bool { return c == '\n' || c == '\r' }
		isWS       = func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
		appendVal  = func(c byte) { v.WriteByte(c) }
		keyString  string
		valString  string
		trimValues bool
	)
	push = func() {
		keyString = k.String()
		if lastKeyWS >= 0 {
			keyString = keyString[:lastKeyWS]
		}
		valString = v.String()
		if trimValues && lastValWS >= 0 {
			valString = valString[:lastValWS]
		}
		if validEnvName(keyString) {
			out = append(out, envAssignment{key: keyString, value: valString, line: startLine})
		}
		k.Reset()
		v.Reset()
		lastValWS, lastKeyWS = -1, -1
	}
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch state {
		case preKey:
			switch {
			case c == '#' || c == ';':
				state = comment
			case !isWS(c):
				state = key
				startLine = line
				lastKeyWS = -1
				k.WriteByte(c)
			}
		case key:
			switch {
			case isNL(c):
				state = preKey
				k.Reset()
			case c == '=':
				state = preValue
				lastValWS = -1
			default:
				if !isWS(c) {
					lastKeyWS = -1
				} else if lastKeyWS < 0 {
					lastKeyWS = k.Len()
				}
				k.WriteByte(c)
			}
		case preValue:
			switch {
			case isNL(c):
				state = preKey
				trimValues = false
				push()
			case c == '\'':
				state = singleQuote
			case c == '"':
				state = doubleQuote
			case c == '\\':
				state = valueEscape
			case !isWS(c):
				state = value
				appendVal(c)
			}
		case value:
			switch {
			case isNL(c):
				state = preKey
				trimValues = true
				push()
			case c == '\\':
				state = valueEscape
				lastValWS = -1
			default:
				if !isWS(c) {
					lastValWS = -1
				} else if lastValWS < 0 {
					lastValWS = v.Len()
				}
				appendVal(c)
			}
		case valueEscape:
			state = value
			if !isNL(c) {
				appendVal(c)
			}
		case singleQuote:
			if c == '\'' {
				state = preValue
			} else {
				appendVal(c)
			}
		case doubleQuote:
			switch c {
			case '"':
				state = preValue
			case '\\':
				state = doubleQuoteEscape
			default:
				appendVal(c)
			}
		case doubleQuoteEscape:
			state = doubleQuote
			switch {
			case c == '"' || c == '\\' || c == '`' || c == '$':
				appendVal(c)
			case c != '\n':
				appendVal('\\')
				appendVal(c)
			}
		case comment:
			switch {
			case c == '\\':
				state = commentEscape
			case isNL(c):
				state = preKey
			}
		case commentEscape:
			if isNL(c) {
				state = preKey
			} else {
				state = comment
			}
		}
		if c == '\n' {
			line++
		}
	}
	switch state {
	case preValue, value, valueEscape, singleQuote, doubleQuote, doubleQuoteEscape:
		trimValues = state == value
		push()
	}
	return out
}
