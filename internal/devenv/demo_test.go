package devenv_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTheDemoInstallsOnlyWhatItRuns: make demo, and the make targets scripts/demo.sh runs, call
// scripts/ensure-tools.sh only in the mode that needs PostgreSQL, Java and Maven (what the demo
// runs), never the test tools (Prometheus' promtool, PgBouncer); make test's call needs those.
func TestTheDemoInstallsOnlyWhatItRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const root = "../.."

	demo, err := os.ReadFile(root + "/scripts/demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	// The make targets the script runs: "make --no-print-directory up LOCAL=..." gives up.
	targets := []string{"demo"}
	for _, line := range strings.Split(string(demo), "\n") {
		words := strings.Fields(line)
		if len(words) == 0 || words[0] != "make" {
			continue
		}
		for _, w := range words[1:] {
			if w == "||" || w == "&&" || w == ";" {
				break
			}
			if !strings.HasPrefix(w, "-") && !strings.Contains(w, "=") {
				targets = append(targets, w)
			}
		}
	}
	if !slices.Contains(targets, "up") {
		t.Fatalf("scripts/demo.sh runs make %v, no make up: the test no longer follows how the demo starts its services", targets[1:])
	}

	// packages is what the ensure-tools calls of make -n TARGET would install on a bare machine.
	packages := func(target string) []string {
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-n", target, "LOCAL=.local-demo-test")
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make -n %s: %v", target, err)
		}
		var pkgs []string
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.Contains(line, "scripts/ensure-tools.sh") {
				continue
			}
			list := exec.CommandContext(ctx, "bash", "-c", line+" --list")
			list.Dir = root
			got, err := list.Output()
			if err != nil {
				t.Fatalf("%s --list: %v", line, err)
			}
			pkgs = append(pkgs, strings.Fields(string(got))...)
		}
		return pkgs
	}

	var demoPkgs []string
	for _, target := range targets {
		demoPkgs = append(demoPkgs, packages(target)...)
	}
	for _, want := range []string{"postgresql", "openjdk-17-jre-headless", "maven"} {
		if !slices.Contains(demoPkgs, want) {
			t.Errorf("make demo (make %v) would not install %s, which it runs; it would install %v", targets, want, demoPkgs)
		}
	}
	testPkgs := packages("test")
	for _, testTool := range []string{"prometheus", "pgbouncer"} {
		if slices.Contains(demoPkgs, testTool) {
			t.Errorf("make demo (make %v) would install %s, a test tool: %v", targets, testTool, demoPkgs)
		}
		if !slices.Contains(testPkgs, testTool) {
			t.Errorf("make test would not install %s, which its tests need: %v", testTool, testPkgs)
		}
	}
}
