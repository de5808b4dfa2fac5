package ec2emu

import "fmt"

// Reclaim plays AWS taking an instance back on its own, as it does at a spot interruption
// notice's deadline: the instance shuts down and terminates as after TerminateInstances, but no
// API call is counted (Terminations and TerminateCalls say what nodevigil asked for, and AWS's
// own stop is not nodevigil's).
func (s *Server) Reclaim(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.instances[id]
	if !ok {
		return fmt.Errorf("reclaim %s: no such instance", id)
	}
	now := s.cfg.Clock.Now()
	if st := s.state(rec, now); st == StateShuttingDown || st == StateTerminated {
		return nil
	}
	rec.terminating, rec.terminatedAt = true, now
	return nil
}
