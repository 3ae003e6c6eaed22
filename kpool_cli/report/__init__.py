"""What a replay, a check and a diff become for people and machines: the JSON report
(`json_report`, its kernels `json_kernels`) and the JSON text every JSON output is
written in (`json_text`); a replay's text views (`text`, `view`, `plain`, `select`)
and page (`trace_page`); the formats of `kpool check` (`check_formats` and the
`check_*` writers); the diff's views (`diff_view`) and page (`diff_page`); the text
of `kpool fuzz` (`fuzz_text`); and the terminal's manners and progress bars
(`terminal`, `ticking`). The report's format is declared once, in
contracts/report_format.py, and its tally in contracts/tally.py."""
