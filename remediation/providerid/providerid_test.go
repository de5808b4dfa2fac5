package providerid

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in       string
		zone, id string
		wantErr  string
	}{
		{in: "aws:///us-east-1a/i-0123456789abcdef0", zone: "us-east-1a", id: "i-0123456789abcdef0"},
		{in: "aws:///us-west-2-lax-1a/i-0123456789abcdef0", zone: "us-west-2-lax-1a", id: "i-0123456789abcdef0"},
		{in: "aws:///eu-central-1b/i-01234567", zone: "eu-central-1b", id: "i-01234567"},
		{in: "aws:////i-0123456789abcdef0", zone: "", id: "i-0123456789abcdef0"},
		{in: "aws://us-east-1a/i-0123456789abcdef0", zone: "us-east-1a", id: "i-0123456789abcdef0"},

		{in: "", wantErr: "empty"},
		{in: "i-0123456789abcdef0", wantErr: "not an AWS provider ID"},
		{in: "gce://project/us-central1-a/node-1", wantErr: "not an AWS provider ID"},
		{in: "AWS:///us-east-1a/i-0123456789abcdef0", wantErr: "not an AWS provider ID"},
		{in: "aws:///us-east-1a", wantErr: "got 1 path segments"},
		{in: "aws:///us-east-1a/i-0123456789abcdef0/extra", wantErr: "got 3 path segments"},
		{in: "aws:///us-east-1a/", wantErr: "instance ID is missing"},
		{in: "aws:///US-EAST-1A/i-0123456789abcdef0", wantErr: `zone "US-EAST-1A"`},
		{in: "aws:///us-east-1a/fargate-ip-10-0-1-2.ec2.internal", wantErr: "is not an EC2 instance ID"},
		{in: "aws:///us-east-1a/i-0123456789ABCDEF0", wantErr: "is not an EC2 instance ID"},
		{in: "aws:///us-east-1a/i-0123456789abcdef", wantErr: "is not an EC2 instance ID"},   // 16 digits
		{in: "aws:///us-east-1a/i-0123456789abcdef01", wantErr: "is not an EC2 instance ID"}, // 18 digits
		{in: "aws:///us-east-1a/i-0123456", wantErr: "is not an EC2 instance ID"},            // 7 digits
		{in: "aws:///us-east-1a/vol-0123456789abcdef0", wantErr: "is not an EC2 instance ID"},
		{in: "aws:///us-east-1a/ i-0123456789abcdef0", wantErr: "is not an EC2 instance ID"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			zone, id, err := Parse(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) = %q, %q, %v; want an error containing %q", tt.in, zone, id, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if zone != tt.zone || id != tt.id {
				t.Errorf("Parse(%q) = %q, %q; want %q, %q", tt.in, zone, id, tt.zone, tt.id)
			}
			if !ValidInstanceID(id) {
				t.Errorf("ValidInstanceID(%q) = false for a parsed ID", id)
			}
		})
	}
}
