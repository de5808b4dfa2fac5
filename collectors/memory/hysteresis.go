package memory

import "time"

// hysteresis holds the memory verdict between checks so that it only changes when the
// readings have been past a threshold for a minimum duration, and so that a reading wobbling
// around one level cannot make it flap: the verdict turns unhealthy only after every
// observation for enterAfter was at or past the enter level, and turns healthy again only
// after every observation for exitAfter was below the (lower) exit level. Readings between
// the two levels keep the current verdict and restart the clock of a pending change.
type hysteresis struct {
	enterAfter time.Duration
	exitAfter  time.Duration

	unhealthy bool
	// pendingSince is when the current run of observations pointing to the other verdict
	// began; zero when no change is pending.
	pendingSince time.Time
}

// observe records one observation made at now. breach says the readings are at or past an
// enter level, clear that they are below every exit level (both false means in between). It
// returns whether the verdict changed.
func (h *hysteresis) observe(now time.Time, breach, clear bool) bool {
	towardsOther, after := breach, h.enterAfter
	if h.unhealthy {
		towardsOther, after = clear, h.exitAfter
	}
	if !towardsOther {
		h.pendingSince = time.Time{}
		return false
	}
	if h.pendingSince.IsZero() {
		h.pendingSince = now
	}
	if now.Sub(h.pendingSince) < after {
		return false
	}
	h.unhealthy = !h.unhealthy
	h.pendingSince = time.Time{}
	return true
}

// reset forgets a pending change. It is called when an observation fails: a condition is only
// "sustained" if it was seen, so a gap in the readings restarts the clock. The verdict itself
// is kept.
func (h *hysteresis) reset() { h.pendingSince = time.Time{} }

// pending returns how long the current run towards the other verdict has lasted and how long
// it must last; ok is false when no change is pending.
func (h *hysteresis) pending(now time.Time) (elapsed, need time.Duration, ok bool) {
	if h.pendingSince.IsZero() {
		return 0, 0, false
	}
	need = h.enterAfter
	if h.unhealthy {
		need = h.exitAfter
	}
	return now.Sub(h.pendingSince), need, true
}
