package ec2emu

import (
	"fmt"
	"regexp"
	"time"
)

// Scheduled event codes, as EC2 names them in DescribeInstanceStatus and in the instance
// metadata (events/maintenance/scheduled).
const (
	EventInstanceReboot     = "instance-reboot"
	EventSystemReboot       = "system-reboot"
	EventSystemMaintenance  = "system-maintenance"
	EventInstanceRetirement = "instance-retirement"
	EventInstanceStop       = "instance-stop"
)

// Scheduled event states, as the instance metadata reports them in State.
const (
	EventStateActive    = "active"
	EventStateCanceled  = "canceled"
	EventStateCompleted = "completed"
)

var eventIDPattern = regexp.MustCompile(`^instance-event-[0-9a-f]{17}$`)

// ScheduledEvent is one scheduled event of an instance. The emulator keeps it for both views
// AWS offers: DescribeInstanceStatus (every event, a finished one with its description
// prefixed "[Completed]" or "[Canceled]", the way EC2 keeps listing it for days) and the
// instance's own metadata (events/maintenance/scheduled and events/maintenance/history).
type ScheduledEvent struct {
	// ID is the event ID, "instance-event-" and 17 lower-case hex digits.
	ID string
	// Code is one of the Event* codes.
	Code string
	// Description is the text EC2 shows ("The instance is scheduled for a reboot").
	Description string
	// NotBefore is the earliest start of the event; NotAfter the latest end (zero for
	// events without one, such as a retirement).
	NotBefore, NotAfter time.Time
	// NotBeforeDeadline is the latest the event can be rescheduled to (zero when it cannot).
	NotBeforeDeadline time.Time
	// State is active, canceled or completed; empty means active.
	State string
}

func (e ScheduledEvent) validate() error {
	if !eventIDPattern.MatchString(e.ID) {
		return fmt.Errorf("event id %q: want \"instance-event-\" followed by 17 lower-case hex digits", e.ID)
	}
	switch e.Code {
	case EventInstanceReboot, EventSystemReboot, EventSystemMaintenance, EventInstanceRetirement, EventInstanceStop:
	default:
		return fmt.Errorf("event %s: code %q is not an EC2 scheduled event code", e.ID, e.Code)
	}
	switch e.State {
	case "", EventStateActive, EventStateCanceled, EventStateCompleted:
	default:
		return fmt.Errorf("event %s: state %q is not active, canceled or completed", e.ID, e.State)
	}
	if e.NotBefore.IsZero() {
		return fmt.Errorf("event %s: NotBefore is required", e.ID)
	}
	return nil
}

// apiDescription is the description DescribeInstanceStatus reports: EC2 keeps finished events
// listed with a "[Completed]" or "[Canceled]" prefix.
func (e ScheduledEvent) apiDescription() string {
	switch e.State {
	case EventStateCompleted:
		return "[Completed] " + e.Description
	case EventStateCanceled:
		return "[Canceled] " + e.Description
	}
	return e.Description
}

// AddScheduledEvent adds (or replaces, by ID) a scheduled event of instance id.
func (s *Server) AddScheduledEvent(id string, ev ScheduledEvent) error {
	if ev.State == "" {
		ev.State = EventStateActive
	}
	if err := ev.validate(); err != nil {
		return fmt.Errorf("add scheduled event: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.instances[id]
	if !ok {
		return fmt.Errorf("add scheduled event: no instance %s", id)
	}
	for i, old := range rec.events {
		if old.ID == ev.ID {
			rec.events[i] = ev
			return nil
		}
	}
	rec.events = append(rec.events, ev)
	return nil
}

// SetScheduledEventState moves an event of instance id to state (active, canceled or
// completed): an event AWS cancels or finishes.
func (s *Server) SetScheduledEventState(id, eventID, state string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.instances[id]
	if !ok {
		return fmt.Errorf("set event state: no instance %s", id)
	}
	for i := range rec.events {
		if rec.events[i].ID == eventID {
			ev := rec.events[i]
			ev.State = state
			if err := ev.validate(); err != nil {
				return fmt.Errorf("set event state: %w", err)
			}
			rec.events[i] = ev
			return nil
		}
	}
	return fmt.Errorf("set event state: instance %s has no event %s", id, eventID)
}

// ScheduledEvents returns the scheduled events of instance id, finished ones included.
func (s *Server) ScheduledEvents(id string) []ScheduledEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.instances[id]
	if !ok {
		return nil
	}
	return append([]ScheduledEvent(nil), rec.events...)
}
