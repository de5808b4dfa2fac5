// Package providerid is the one grammar of a Node's spec.providerID that nodevigil accepts: the
// remediator's pipeline (which must know the instance before anything disruptive) and the EC2
// client (which must never send a malformed ID that would fail a whole batch) both use it, so
// they cannot disagree about which nodes are EC2 instances. It has no dependencies.
package providerid

import (
	"fmt"
	"regexp"
	"strings"
)

// instanceIDPattern is the form of an EC2 instance ID: "i-" and 8 (instances launched before
// 2016) or 17 lower-case hexadecimal digits. Checking it locally keeps IDs EC2 would reject as
// InvalidInstanceID.Malformed (which fails a whole call) out of every request.
var instanceIDPattern = regexp.MustCompile(`^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$`)

// zonePattern is deliberately loose: Availability Zones, Local Zones and Wavelength Zones all
// use lower-case letters, digits and dashes ("us-east-1a", "us-west-2-lax-1a").
var zonePattern = regexp.MustCompile(`^[a-z0-9-]+$`)

// ValidInstanceID reports whether id has the form of an EC2 instance ID.
func ValidInstanceID(id string) bool { return instanceIDPattern.MatchString(id) }

// Parse extracts the Availability Zone and the EC2 instance ID from a Node's
// spec.providerID, which the AWS cloud provider, Karpenter and EKS write as
// "aws:///<zone>/<instance-id>" (an empty URL host, hence the three slashes).
//
// Also accepted, because the instance ID in them is just as unambiguous:
//   - "aws:////<instance-id>" (no zone, written by some older kubelets); zone is then "".
//   - "aws://<zone>/<instance-id>" (the zone as the URL host).
//
// Everything else is an error naming what is wrong: another cloud's scheme, a bare instance ID
// (ambiguous outside AWS), a Fargate pseudo-node ("fargate-ip-…" is no EC2 instance and cannot
// be terminated), extra path segments, or an ID not of the i-[0-9a-f]{8|17} form. The
// remediator must never terminate anything on a guess, so parsing is strict.
func Parse(providerID string) (zone, instanceID string, err error) {
	if providerID == "" {
		return "", "", fmt.Errorf("provider ID is empty: the Node has no spec.providerID (not yet initialised by the cloud provider?)")
	}
	rest, ok := strings.CutPrefix(providerID, "aws://")
	if !ok {
		return "", "", fmt.Errorf("provider ID %q is not an AWS provider ID: want \"aws:///<zone>/<instance-id>\"", providerID)
	}
	// "aws:///zone/id" leaves "/zone/id"; "aws://zone/id" leaves "zone/id".
	rest = strings.TrimPrefix(rest, "/")
	parts := strings.Split(rest, "/")
	if len(parts) != 2 {
		return "", "", fmt.Errorf("provider ID %q: want exactly a zone and an instance ID after \"aws:///\", got %d path segments", providerID, len(parts))
	}
	zone, instanceID = parts[0], parts[1]
	if zone != "" && !zonePattern.MatchString(zone) {
		return "", "", fmt.Errorf("provider ID %q: zone %q is not a valid Availability Zone name", providerID, zone)
	}
	if instanceID == "" {
		return "", "", fmt.Errorf("provider ID %q: the instance ID is missing", providerID)
	}
	if !instanceIDPattern.MatchString(instanceID) {
		return "", "", fmt.Errorf("provider ID %q: %q is not an EC2 instance ID (want \"i-\" and 8 or 17 lower-case hex digits)", providerID, instanceID)
	}
	return zone, instanceID, nil
}
