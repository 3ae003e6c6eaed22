"""What a replay becomes for people and machines: the tally (`tally`), the report
format declared once (`format`), the JSON report (`json_report`), the text views
(`text`, `view`, `plain`) and the diff's view (`diff_view`)."""
