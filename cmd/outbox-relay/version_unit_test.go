package main

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionSaysWhatTheBinaryWasBuiltFrom: the version, the commit, the commit's time and
// whether the tree was modified, from the build information Go records, with -ldflags stamps for
// the version and for a build where Go saw no git checkout.
func TestVersionSaysWhatTheBinaryWasBuiltFrom(t *testing.T) {
	vcs := func(settings ...string) *debug.BuildInfo {
		info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/outbox-relay/outbox-relay", Version: "(devel)"}}
		info.Settings = append(info.Settings, debug.BuildSetting{Key: "GOOS", Value: "linux"}, debug.BuildSetting{Key: "GOARCH", Value: "arm64"})
		for i := 0; i+1 < len(settings); i += 2 {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return info
	}
	const rev = "5f2e3bf0a1b2c3d4e5f60718293a4b5c6d7e8f90"
	for _, tc := range []struct {
		name    string
		stamped stamp
		info    *debug.BuildInfo
		want    string
	}{
		{
			name:    "a release build says its stamped version and the commit Go recorded",
			stamped: stamp{version: "v1.4.0"},
			info:    vcs("vcs.revision", rev, "vcs.time", "2026-12-06T19:40:00Z", "vcs.modified", "false"),
			want:    "outbox-relay v1.4.0\ncommit:      " + rev + "\ncommit time: 2026-12-06T19:40:00Z\ngo:          go1.26.8 linux/arm64\n",
		},
		{
			name: "a build from a modified tree says so",
			info: vcs("vcs.revision", rev, "vcs.time", "2026-12-06T19:40:00Z", "vcs.modified", "true"),
			want: "outbox-relay dev\ncommit:      " + rev + " (modified: built with uncommitted changes)\ncommit time: 2026-12-06T19:40:00Z\ngo:          go1.26.8 linux/arm64\n",
		},
		{
			name:    "without vcs settings the stamped commit and time stand in",
			stamped: stamp{version: "v1.4.0-3-g5f2e3bf", commit: rev, commitTime: "2026-12-06T19:40:00Z"},
			info:    vcs(),
			want:    "outbox-relay v1.4.0-3-g5f2e3bf\ncommit:      " + rev + "\ncommit time: 2026-12-06T19:40:00Z\ngo:          go1.26.8 linux/arm64\n",
		},
		{
			name:    "the commit Go recorded wins over a stamped one, with its own time",
			stamped: stamp{commit: "0000000", commitTime: "2020-01-01T00:00:00Z"},
			info:    vcs("vcs.revision", rev),
			want:    "outbox-relay dev\ncommit:      " + rev + "\ngo:          go1.26.8 linux/arm64\n",
		},
		{
			name: "go install's module version is the version when nothing is stamped",
			info: func() *debug.BuildInfo { i := vcs(); i.Main.Version = "v1.4.0"; return i }(),
			want: "outbox-relay v1.4.0\ncommit:      unknown (built outside a git checkout)\ngo:          go1.26.8 linux/arm64\n",
		},
		{
			name: "a binary without build information is dev",
			want: "outbox-relay dev\ncommit:      unknown (built outside a git checkout)\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			readBuildVersion(tc.stamped, tc.info).write(&out)
			if out.String() != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), tc.want)
			}
		})
	}
}

// TestTheVersionCommandPrintsTheBinarysVersion: `outbox-relay version` (and --version) print the
// version line first, then the commit, from this test binary's own build information.
func TestTheVersionCommandPrintsTheBinarysVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{arg}, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d: %s", arg, code, stderr.String())
		}
		lines := strings.Split(stdout.String(), "\n")
		if lines[0] != "outbox-relay dev" || len(lines) < 3 || !strings.HasPrefix(lines[1], "commit:      ") {
			t.Errorf("%s printed:\n%s\nwant outbox-relay dev, then the commit", arg, stdout.String())
		}
	}
}
