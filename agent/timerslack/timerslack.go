// Package timerslack runs the agent with a coarser kernel timer slack, so that the Go
// runtime's sysmon thread naps in a few long sleeps instead of hundreds of 20 µs ones.
//
// Why: an idle agent's CPU is mostly the cost of waking up, and nine in ten of its wake-ups
// were sysmon's (docs/benchmarks.md, "Session 13"). When every goroutine is asleep the
// runtime waits for its next timer in two threads at once: one parked in epoll_wait, whose
// timeout Linux lets run late by 0.1 % of its length (10 ms for the 10 s between check
// cycles), and sysmon, asleep on a futex until the timer's exact deadline. Sysmon then finds
// the timer due but not yet run and polls every 20 µs (doubling only after 50 polls) until the
// other thread wakes; and while the cycle's work runs it polls every 20 µs again. Each poll is
// a trip through the kernel's scheduler (~30 µs of CPU on a virtual machine). The timer slack
// is how far the kernel may defer a thread's timed sleeps to fire them together with other
// wake-ups (systemd's TimerSlackNSec=, for daemons whose timing is loose): with Slack, each
// 20 µs nap lasts until the next wake-up the CPU takes anyway or Slack, so sysmon's ~60
// wake-ups a cycle become a handful and the agent's timers fire at most Slack late, which
// nothing in it notices (its jobs run every 2 s or more, its deadlines are seconds long).
//
// A thread's slack can be set only by the thread itself (another thread's needs
// CAP_SYS_NICE), is inherited by the threads it creates and is kept across execve(2); the
// runtime starts sysmon before main runs. So Ensure sets the slack of the calling thread and
// executes the agent's binary again in place: same PID, arguments and environment, and every
// thread of the new image, sysmon included, starts with the slack.
package timerslack

import "time"

// Slack is the agent's timer slack. Long enough to cover the 10 ms by which the runtime's
// poller wakes late after a 10 s sleep and to turn sysmon's 20 µs naps into one or two per
// check cycle; short against everything the agent times (the 2 s spot poll, API deadlines of
// seconds). The kernel's default is 50 µs.
const Slack = 5 * time.Millisecond
