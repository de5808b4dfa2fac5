//go:build !linux

package residency

import "runtime/debug"

// Release gives the start-up heap back to the operating system; the binary's pages are
// released on Linux only.
func Release() (Stats, error) {
	debug.FreeOSMemory()
	return Stats{}, nil
}
