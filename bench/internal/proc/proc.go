// Package proc reads the Linux /proc figures the benchmark programs
// report beside their numbers, and finds the PostgreSQL backends whose
// CPU they count.
package proc

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat's utime and stime
// (100 on every Linux this runs on).
const ClockTicks = 100

// LoadAverage returns /proc/loadavg's first three fields, or "unknown".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Ticks returns utime+stime of pid in ClockTicks; an error if the
// process is gone (or not on this machine).
func Ticks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields after its ')'.
	// State is the first of them, utime and stime the 12th and 13th.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want 13 or more", pid, len(f))
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st, nil
}

// AppDSN returns dsn with application_name set, so the run's backends
// can be found in pg_stat_activity (Backends).
func AppDSN(dsn, app string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "application_name=" + app
}

// Backends returns the pids of the PostgreSQL backends whose
// application_name is app.
func Backends(ctx context.Context, db *sql.DB, app string) ([]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, rows.Err()
}
