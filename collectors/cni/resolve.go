package cni

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// maxSymlinks bounds symlink resolution, as the kernel does (ELOOP after 40).
const maxSymlinks = 40

// resolveInRoot returns the path under root of name (a host path), with every symlink on the
// way resolved as the host would resolve it: absolute targets start again at root, ".." stops
// at root. The agent sees the host's filesystem mounted at root, where an absolute symlink
// such as /opt/cni/bin -> /usr/libexec/cni would otherwise be followed into the agent's own
// container image. A missing component gives an error wrapping fs.ErrNotExist.
func resolveInRoot(root, name string) (string, error) {
	pending := strings.Split(filepath.ToSlash(name), "/")
	resolved := make([]string, 0, len(pending))
	links := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(resolved) > 0 {
				resolved = resolved[:len(resolved)-1]
			}
			continue
		}
		cur := filepath.Join(root, filepath.Join(resolved...), c)
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = append(resolved, c)
			continue
		}
		if links++; links > maxSymlinks {
			return "", &fs.PathError{Op: "resolve", Path: name, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(cur)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			resolved = resolved[:0]
		}
		pending = append(strings.Split(filepath.ToSlash(target), "/"), pending...)
	}
	return filepath.Join(root, filepath.Join(resolved...)), nil
}
