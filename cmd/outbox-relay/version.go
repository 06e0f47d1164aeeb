package main

import (
	"fmt"
	"io"
	"runtime/debug"
)

// Stamped at build time with -ldflags "-X main.version=... -X main.commit=... -X main.commitTime=..."
// (make build, make release, deploy/Dockerfile). version wins over the module version go install
// records (else dev); commit and commitTime stand in for the vcs settings Go records itself only
// when it sees the git checkout (not in a git worktree, nor in an image build without .git).
var version, commit, commitTime string

// buildVersion is what `outbox-relay version` says about the binary: its version, then the commit,
// the commit's time and whether the tree had uncommitted changes, from the build information Go
// records (vcs.* settings, present when the binary was built in a git checkout), and the Go version
// and platform.
type buildVersion struct {
	Version, Commit, CommitTime, GoVersion, Platform string
	Modified                                         bool
}

// stamp is what -ldflags set.
type stamp struct{ version, commit, commitTime string }

// readBuildVersion reads the stamped values and the build information (info is nil when the
// binary carries none); the build information's commit wins over a stamped one.
func readBuildVersion(stamped stamp, info *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: stamped.version, Commit: stamped.commit, CommitTime: stamped.commitTime}
	if info == nil {
		if v.Version == "" {
			v.Version = "dev"
		}
		return v
	}
	if v.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v.Version = info.Main.Version
	}
	if v.Version == "" {
		v.Version = "dev"
	}
	v.GoVersion = info.GoVersion
	var goos, goarch string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
			v.CommitTime = "" // from vcs.time, or none: never another commit's
		}
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	if goos != "" {
		v.Platform = goos + "/" + goarch
	}
	return v
}

// write prints the version on the first line (what scripts read), then one fact per line.
func (v buildVersion) write(w io.Writer) {
	fmt.Fprintf(w, "outbox-relay %s\n", v.Version)
	commit := v.Commit
	switch {
	case commit == "":
		commit = "unknown (built outside a git checkout)"
	case v.Modified:
		commit += " (modified: built with uncommitted changes)"
	}
	fmt.Fprintf(w, "commit:      %s\n", commit)
	if v.CommitTime != "" {
		fmt.Fprintf(w, "commit time: %s\n", v.CommitTime)
	}
	if v.GoVersion != "" {
		fmt.Fprintf(w, "go:          %s %s\n", v.GoVersion, v.Platform)
	}
}

// thisBuild is what the running binary was built from.
func thisBuild() buildVersion {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return readBuildVersion(stamp{version, commit, commitTime}, info)
}

func printVersion(w io.Writer) { thisBuild().write(w) }
