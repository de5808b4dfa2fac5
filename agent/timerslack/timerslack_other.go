//go:build !linux

package timerslack

import (
	"errors"
	"time"
)

var errUnsupported = errors.New("timer slack is a Linux feature")

// Current reports that there is no timer slack to read off Linux.
func Current() (time.Duration, error) { return 0, errUnsupported }

// Ensure does nothing off Linux, where the agent does not run in production.
func Ensure(time.Duration) error { return nil }
