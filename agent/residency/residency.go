// Package residency gives back the memory the agent only needed to start.
//
// Most of the agent's resident set is not its heap but its own binary: about 15 MiB of a
// 27 MiB executable is mapped in after start-up (docs/benchmarks.md, "Where the agent's
// memory goes"). Start-up runs code that steady state never runs again (package inits, flag
// and config parsing, the API client's set-up, the first reads of every collector), and each
// page fault on the binary maps in its neighbours as well (the kernel's fault-around), so the
// mapped share of the binary ends up close to all of it. Steady state runs a small part of it
// (a check cycle, a Lease renewal, a few metadata reads, a metrics scrape).
//
// Release, called once after start-up, drops the mappings of the binary's read-only pages
// (text and read-only data) and gives the start-up heap back to the operating system. The
// pages stay in the page cache and are mapped again, on first use, by the code that still
// runs; the rest are no longer held mapped by the agent, so the kernel is free to reclaim
// them first (they are also moved to the inactive list where the kernel supports it). It
// never touches writable mappings, so no state is lost, and it does nothing while a
// debugger is attached (software breakpoints live in private copies of text pages).
package residency

// Stats is what Release did: how many bytes of the binary were mapped before and after, as
// /proc/self/smaps counts them (Rss of the executable's read-only mappings).
type Stats struct {
	// Mappings is how many read-only mappings of the executable were released.
	Mappings int
	// Before and After are the resident bytes of those mappings around the call.
	Before, After int64
}
