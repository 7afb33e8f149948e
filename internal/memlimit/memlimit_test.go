package memlimit

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    Limit
		wantErr string
	}{
		{"", Limit{Auto: true}, ""},
		{"auto", Limit{Auto: true}, ""},
		{"off", Limit{}, ""},
		{"0", Limit{}, ""},
		{"400MiB", Limit{Bytes: 400 << 20}, ""},
		{"1GiB", Limit{Bytes: 1 << 30}, ""},
		{"2TiB", Limit{Bytes: 2 << 40}, ""},
		{"64KiB", Limit{Bytes: 64 << 10}, ""},
		{"123456789", Limit{Bytes: 123456789}, ""},
		{"100B", Limit{Bytes: 100}, ""},
		{"400MB", Limit{}, `memory limit "400MB": not a whole number of bytes with a unit; want auto, off, or a size such as 400MiB`},
		{"-5MiB", Limit{}, "not positive"},
		{"1.5GiB", Limit{}, "not a whole number"},
		{"9999999999TiB", Limit{}, "too large"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestCgroupLimit(t *testing.T) {
	tests := []struct {
		name    string
		fs      fstest.MapFS
		want    int64
		wantErr string
	}{
		{"v2 in a container (its own cgroup is the mount's root)", fstest.MapFS{
			"proc/self/cgroup":         {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("536870912\n")},
		}, 536870912, ""},
		{"v2 systemd unit under a slice with a lower limit", fstest.MapFS{
			"proc/self/cgroup": {Data: []byte("0::/system.slice/clodex-controlplane.service\n")},
			"sys/fs/cgroup/system.slice/clodex-controlplane.service/memory.max": {Data: []byte("max\n")},
			"sys/fs/cgroup/system.slice/memory.max":                             {Data: []byte("268435456\n")},
		}, 268435456, ""},
		{"v2 path not under the mount (a container without cgroupns)", fstest.MapFS{
			"proc/self/cgroup":         {Data: []byte("0::/kubepods/pod1/abc\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("1073741824\n")},
		}, 1073741824, ""},
		{"v2 without a limit", fstest.MapFS{
			"proc/self/cgroup":                    {Data: []byte("0::/user.slice\n")},
			"sys/fs/cgroup/user.slice/memory.max": {Data: []byte("max\n")},
		}, 0, ""},
		{"v1 with a limit", fstest.MapFS{
			"proc/self/cgroup": {Data: []byte("9:name=systemd:/\n4:memory:/process_api/x\n0::/\n")},
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": {Data: []byte("402653184\n")},
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               {Data: []byte("9223372036854771712\n")},
		}, 402653184, ""},
		{"v1 unlimited", fstest.MapFS{
			"proc/self/cgroup": {Data: []byte("4:cpu,memory:/a\n")},
			"sys/fs/cgroup/memory/a/memory.limit_in_bytes": {Data: []byte("9223372036854771712\n")},
		}, 0, ""},
		{"no cgroup file", fstest.MapFS{}, 0, "read the process's cgroup"},
		{"an unreadable limit", fstest.MapFS{
			"proc/self/cgroup":         {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("lots\n")},
		}, 0, `read /sys/fs/cgroup/memory.max: "lots" is not a limit in bytes or max`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CgroupLimit(tt.fs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("CgroupLimit = %d, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("CgroupLimit = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestChoose(t *testing.T) {
	limited := fstest.MapFS{
		"proc/self/cgroup":         {Data: []byte("0::/\n")},
		"sys/fs/cgroup/memory.max": {Data: []byte("1000000000\n")},
	}
	env := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) { return v, k == "GOMEMLIMIT" && v != "" }
	}
	tests := []struct {
		name string
		l    Limit
		env  string
		fs   fstest.MapFS
		want Choice
	}{
		{"the flag wins", Limit{Bytes: 300 << 20}, "200MiB", limited, Choice{Bytes: 300 << 20, Source: SourceFlag}},
		{"the flag turns it off", Limit{}, "200MiB", limited, Choice{Source: SourceNone}},
		{"GOMEMLIMIT is the runtime's", Limit{Auto: true}, "200MiB", limited, Choice{Source: SourceEnv}},
		{"GOMEMLIMIT=off", Limit{Auto: true}, "off", limited, Choice{Source: SourceNone}},
		{"0.9 of the cgroup's", Limit{Auto: true}, "", limited, Choice{Bytes: 900000000, Source: SourceCgroup, Cgroup: 1000000000}},
		{"no cgroup limit", Limit{Auto: true}, "", fstest.MapFS{"proc/self/cgroup": {Data: []byte("0::/\n")}}, Choice{Source: SourceNone}},
	}
	for _, tt := range tests {
		if got := Choose(tt.l, env(tt.env), tt.fs); got != tt.want {
			t.Errorf("%s: Choose = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
