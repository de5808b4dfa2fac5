package main

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// The remediator's interruption bookkeeping and the agent's AWS event conditions, as the
// remediator writes and reads them (remediation/interruptions*.go). Repeated here so that the
// plugin does not link the remediator's controller; interruptions_test.go holds them equal.
const (
	annotationInterruption                 = "nodevigil.io/interruption"
	annotationInterruptionWasUnschedulable = "nodevigil.io/interruption-was-unschedulable"

	conditionNoSpotInterruption        = "NoSpotInterruption"
	conditionNoRebalanceRecommendation = "NoRebalanceRecommendation"
	conditionNoScheduledEvent          = "NoScheduledEvent"
	conditionNoASGTermination          = "NoASGTermination"
)

// stateInterruption is the state of a node nodevigil cordoned for an AWS event.
const stateInterruption = "Interruption"

// awsEventPolicy says, for one of the agent's AWS event conditions, which field of the
// policy's interruptions block decides what it means and what that field says; ok is false for
// any other condition.
func awsEventPolicy(condType string, in config.Interruptions) (field string, action config.InterruptionAction, ok bool) {
	switch condType {
	case conditionNoSpotInterruption:
		return "spotInterruption", in.SpotInterruption, true
	case conditionNoRebalanceRecommendation:
		return "rebalanceRecommendation", in.RebalanceRecommendation, true
	case conditionNoScheduledEvent:
		return "scheduledReboot/scheduledRetirement", "", true
	case conditionNoASGTermination:
		return "asgTermination", in.ASGTermination, true
	}
	return "", "", false
}

// awsEventSentence explains an AWS event condition by the policy's interruptions block, where
// the generic sentence ("does not list it, so it never leads to remediation") would mislead.
func awsEventSentence(policy string, condType string, in config.Interruptions) string {
	field, action, _ := awsEventPolicy(condType, in)
	if action == "" {
		return fmt.Sprintf("An AWS event: policy %s's interruptions block decides, scheduledReboot %s and scheduledRetirement %s, %s before NotBefore at the earliest (leadTime)",
			policy, in.ScheduledReboot, in.ScheduledRetirement, in.LeadTime)
	}
	return fmt.Sprintf("An AWS event: policy %s's interruptions.%s is %s (%s)", policy, field, action, actionMeaning(action))
}

// rebootSentence says how long policy p tolerates a silence that begins inside the window of
// a scheduled reboot the agent's NoScheduledEvent condition lists, or "" when it lists none.
func rebootSentence(p *config.Policy, condType, status, message string) string {
	if condType != conditionNoScheduledEvent || status != string(corev1.ConditionFalse) {
		return ""
	}
	for _, e := range decide.ParseScheduledEvents(message) {
		if !decide.ExpectsReboot(e.Code) {
			continue
		}
		t := p.Tolerations
		if t.ScheduledReboot <= t.SilentNode {
			return fmt.Sprintf("Policy %s gives a silence inside the window of %s %s no extra time (tolerations.scheduledReboot %s, silentNode %s)",
				p.Name, e.Code, e.ID, t.ScheduledReboot, t.SilentNode)
		}
		return fmt.Sprintf("If the node goes silent inside the window of %s %s, AWS is rebooting it: policy %s tolerates that %s (tolerations.scheduledReboot) rather than silentNode %s",
			e.Code, e.ID, p.Name, t.ScheduledReboot, t.SilentNode)
	}
	return ""
}

func actionMeaning(a config.InterruptionAction) string {
	switch a {
	case config.InterruptionDrain:
		return "cordon, then drain"
	case config.InterruptionReplace:
		return "drain, then terminate early"
	case config.InterruptionCordonOnly:
		return "cordon only"
	case config.InterruptionNotify:
		return "reported only"
	case config.InterruptionIgnore:
		return "ignored"
	}
	return "unknown action"
}

// interruptionSentence explains a cordon nodevigil holds for an AWS event, from its record
// "<event ID>/<action>".
func interruptionSentence(record string, wasUnschedulable bool) string {
	id, action, _ := strings.Cut(record, "/")
	s := fmt.Sprintf("The node is cordoned (and tainted %s) by nodevigil for the AWS event %s, action %s. It is uncordoned once the event is positively gone: canceled or completed, as the agent or EC2 reports it; an agent that cannot read the metadata service keeps it cordoned",
		annotationInterruption, id, action)
	if wasUnschedulable {
		s += ". It was already cordoned before, so it will stay cordoned"
	}
	return s + "."
}
