module draslice.dev/croncheck

go 1.26

require github.com/robfig/cron v1.2.0
