"""What a replay becomes for people and machines: tally, JSON report, text views."""
