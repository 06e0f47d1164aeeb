// Package deploy_test checks the shipped operations artefacts against the code they describe: every
// file parses, every metric an alert or the dashboard uses exists, the compose file, the Kubernetes
// manifests and the example configuration load through the config package, and the Dockerfile's
// build command builds a static binary. With promtool on PATH it also checks and unit-tests the
// alert rules and parses every dashboard query. The shard overlays (kubernetes-shards/) must differ
// from the base only where a shard must.
package deploy_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// The job label the alerts and the dashboard select; compose's scrape config and the Kubernetes
// Service name must produce it.
const job = "outbox-relay"

func TestEveryYAMLFileParses(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yml") && !strings.HasSuffix(path, ".yaml")) {
			return err
		}
		n++
		docs := readYAMLDocs(t, path)
		if len(docs) == 0 {
			t.Errorf("%s: no YAML document", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Errorf("found %d YAML files under deploy/, want the compose file, Prometheus, Grafana and Kubernetes files", n)
	}
}

func TestTheDashboardIsValidAndCoversTheRelay(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title, got uid %q title %q", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("dashboard needs a datasource variable (so it works when imported elsewhere), got variables %v", vars)
	}
	ids := map[int]bool{}
	for i, p := range d.Panels {
		for _, q := range d.Panels[:i] {
			a, b := p.GridPos, q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q and %q overlap (%+v, %+v)", p.Title, q.Title, a, b)
			}
		}
		if ids[p.ID] {
			t.Errorf("panel %q: id %d is used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v does not fit the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource uid %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %s has no expression", p.Title, tg.RefID)
			}
		}
	}
	// What an operator must be able to see (the dashboard's brief).
	used := strings.Join(dashboardExprs(d), "\n")
	for _, m := range []string{
		"outbox_relay_events_published_total", "outbox_relay_end_to_end_latency_seconds_bucket",
		"outbox_relay_slot_lag_bytes", "outbox_relay_seconds_behind_source", "outbox_relay_slot_retained_wal_bytes",
		"outbox_relay_slot_safe_wal_size_bytes", "outbox_relay_slot_wal_status", "outbox_relay_in_flight_events",
		"outbox_relay_in_flight_bytes", "outbox_relay_events_failed_total", "outbox_relay_events_dead_lettered_total",
		"outbox_relay_leader", "outbox_relay_ready", "outbox_relay_reconnects_total",
	} {
		if !strings.Contains(used, m) {
			t.Errorf("the dashboard shows nothing of %s", m)
		}
	}
	for _, q := range []string{"0.5", "0.95", "0.99"} {
		if !strings.Contains(used, "histogram_quantile("+q+", sum by (le) (rate(outbox_relay_end_to_end_latency_seconds_bucket") {
			t.Errorf("the dashboard has no p%s of the end-to-end latency", strings.TrimPrefix(q, "0."))
		}
	}
}

func TestEveryMetricInTheAlertsAndTheDashboardExists(t *testing.T) {
	known := knownSeries(t)
	targetLabels := []string{"job", "instance", "namespace", "pod", "container", "endpoint", "service"}
	allLabels := map[string]bool{}
	for _, l := range targetLabels {
		allLabels[l] = true
	}
	for _, labels := range known {
		for _, l := range labels {
			allLabels[l] = true
		}
	}

	sources := map[string][]string{"prometheus/alerts.yml": alertExprs(t)}
	sources["grafana/dashboards/outbox-relay.json"] = dashboardExprs(loadDashboard(t))
	metricRe := regexp.MustCompile(`\b(outbox_relay_[a-zA-Z0-9_]+|process_[a-z0-9_]+|go_[a-z0-9_]+)\b`)
	selectorRe := regexp.MustCompile(`\b(outbox_relay_[a-zA-Z0-9_]+|process_[a-z0-9_]+|go_[a-z0-9_]+|up)\s*\{([^}]*)\}`)
	matcherRe := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	groupingRe := regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	for file, exprs := range sources {
		if len(exprs) == 0 {
			t.Errorf("%s: no expressions found", file)
		}
		for _, expr := range exprs {
			for _, m := range metricRe.FindAllString(expr, -1) {
				if _, ok := known[m]; !ok {
					t.Errorf("%s: %s is not a metric the relay exposes (expression %q)", file, m, expr)
				}
			}
			for _, sel := range selectorRe.FindAllStringSubmatch(expr, -1) {
				labels, ok := known[sel[1]]
				if sel[1] == "up" {
					labels, ok = nil, true
				}
				for _, lm := range matcherRe.FindAllStringSubmatch(sel[2], -1) {
					if ok && !slices.Contains(labels, lm[1]) && !slices.Contains(targetLabels, lm[1]) {
						t.Errorf("%s: %s has no label %q (it has %v; targets add %v)", file, sel[1], lm[1], labels, targetLabels)
					}
				}
			}
			for _, g := range groupingRe.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); l != "" && !allLabels[l] {
						t.Errorf("%s: grouping by %q, which no relay metric or target has (expression %q)", file, l, expr)
					}
				}
			}
		}
	}
}

func TestEveryAlertHasARunbookSectionAndAFiringTest(t *testing.T) {
	runbook, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatalf("the alerts link to docs/operations.md: %v", err)
	}
	anchors := markdownAnchors(string(runbook))
	tested := firingTests(t)
	rules := alertRules(t)
	if len(rules) < 10 {
		t.Fatalf("found %d alerts in alerts.yml", len(rules))
	}
	for _, r := range rules {
		t.Run(r.Alert, func(t *testing.T) {
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("severity %q, want warning or critical", s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("needs a summary and a description")
			}
			url := r.Annotations["runbook_url"]
			_, anchor, ok := strings.Cut(url, "docs/operations.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("runbook_url %q does not point at a heading of docs/operations.md", url)
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("runbook anchor %q, want the alert's own section #%s", anchor, strings.ToLower(r.Alert))
			}
			if !tested[r.Alert] {
				t.Errorf("alerts_test.yml has no case in which %s fires", r.Alert)
			}
		})
	}
}

// TestPrometheusAcceptsTheRulesAndTheQueries runs Prometheus' own checks with promtool, which
// `make test` installs (scripts/ensure-tools.sh test; Debian: apt-get install prometheus): without
// them the alert rules' unit tests would not run at all.
func TestPrometheusAcceptsTheRulesAndTheQueries(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not on PATH: run `make tools` (or apt-get install prometheus); the alert rules and their unit tests are checked by Prometheus itself")
	}
	// Dashboard queries become recording rules, so promtool parses each one. Grafana's variables are
	// replaced by values of the same shape first.
	var rules []map[string]string
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$__interval", "1m",
		"$job", job, "$instance", ".*")
	for i, e := range dashboardExprs(loadDashboard(t)) {
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", i), "expr": vars.Replace(e)})
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dashRules := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(dashRules, out, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"the alert rules pass promtool check rules", []string{"check", "rules", "prometheus/alerts.yml"}},
		{"the alert rules pass their unit tests", []string{"test", "rules", "prometheus/alerts_test.yml"}},
		{"the compose Prometheus configuration passes promtool check config", []string{"check", "config", "prometheus/prometheus.yml"}},
		{"every dashboard query parses", []string{"check", "rules", dashRules}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, promtool, tc.args...).CombinedOutput()
			if err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
		})
	}
}

func TestTheComposeFileIsConsistent(t *testing.T) {
	var c struct {
		Services map[string]composeService `yaml:"services"`
	}
	decodeYAML(t, "docker-compose.yml", &c)
	require := func(name string) composeService {
		s, ok := c.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml has no service %q", name)
		}
		return s
	}

	t.Run("every file it mounts or builds from exists", func(t *testing.T) {
		for name, s := range c.Services {
			for _, v := range s.Volumes {
				src, _, _ := strings.Cut(v, ":")
				if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
					if _, err := os.Stat(src); err != nil {
						t.Errorf("service %s mounts %s: %v", name, src, err)
					}
				}
			}
			if s.Build != nil {
				if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
					t.Errorf("service %s builds from %s/%s: %v", name, s.Build.Context, s.Build.Dockerfile, err)
				}
			}
			for dep := range s.DependsOn {
				if _, ok := c.Services[dep]; !ok {
					t.Errorf("service %s depends on %s, which does not exist", name, dep)
				}
			}
		}
	})

	t.Run("every published port is bound to the loopback interface", func(t *testing.T) {
		// The demo's PostgreSQL and Kafka have well-known passwords and no TLS: published on
		// every interface, anyone on the network reaches them.
		for name, s := range c.Services {
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("service %s publishes %q on every interface: write 127.0.0.1:%s", name, p, p)
				}
			}
		}
	})

	t.Run("PostgreSQL runs with wal_level=logical on version 15 or later", func(t *testing.T) {
		pg := require("postgres")
		if !slices.Contains(pg.Command, "wal_level=logical") {
			t.Errorf("postgres command %v does not set wal_level=logical", pg.Command)
		}
		if v := imageMajor(t, pg.Image, "postgres"); v < 15 {
			t.Errorf("postgres image %s: want 15 or later", pg.Image)
		}
	})

	t.Run("Kafka is a single KRaft node of version 4 or later", func(t *testing.T) {
		k := require("kafka")
		if v := imageMajor(t, k.Image, "apache/kafka"); v < 4 {
			t.Errorf("kafka image %s: want apache/kafka 4 or later", k.Image)
		}
		if k.Environment["KAFKA_PROCESS_ROLES"] != "broker,controller" {
			t.Errorf("KAFKA_PROCESS_ROLES %q, want broker,controller", k.Environment["KAFKA_PROCESS_ROLES"])
		}
	})

	t.Run("migrate runs once as the table owner before the relays start", func(t *testing.T) {
		m := require("migrate")
		if !slices.Equal(m.Command, []string{"migrate"}) {
			t.Errorf("migrate command %v", m.Command)
		}
		loadEnvConfig(t, "migrate", m.Environment)
	})

	var relays []string
	for name, s := range c.Services {
		if slices.Contains(s.Command, "run") {
			relays = append(relays, name)
		}
	}
	sort.Strings(relays)
	t.Run("two relay replicas with a valid configuration", func(t *testing.T) {
		if len(relays) != 2 {
			t.Fatalf("relay services %v, want two (leader and standby)", relays)
		}
		for _, name := range relays {
			s := c.Services[name]
			cfg := loadEnvConfig(t, name, s.Environment)
			if cfg.CreatePublication {
				t.Errorf("%s: create_publication is on, but the relay's role does not own the table", name)
			}
			if !strings.Contains(cfg.PGDSN, "outbox_relay") {
				t.Errorf("%s: pg_dsn should use the least-privilege outbox_relay role", name)
			}
			grace, err := time.ParseDuration(s.StopGracePeriod)
			if err != nil || grace <= cfg.ShutdownTimeout {
				t.Errorf("%s: stop_grace_period %q must exceed shutdown_timeout %s", name, s.StopGracePeriod, cfg.ShutdownTimeout)
			}
			if _, ok := s.DependsOn["grant"]; !ok {
				t.Errorf("%s must wait for the grant service (the table and its grants exist only then)", name)
			}
			if !s.ReadOnly {
				t.Errorf("%s: read_only should be true (the relay writes no files)", name)
			}
		}
	})

	t.Run("Prometheus scrapes every relay replica and loads the alerts", func(t *testing.T) {
		var pc struct {
			RuleFiles     []string `yaml:"rule_files"`
			ScrapeConfigs []struct {
				JobName       string `yaml:"job_name"`
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"scrape_configs"`
		}
		decodeYAML(t, "prometheus/prometheus.yml", &pc)
		var targets []string
		for _, sc := range pc.ScrapeConfigs {
			if sc.JobName == job {
				for _, st := range sc.StaticConfigs {
					targets = append(targets, st.Targets...)
				}
			}
		}
		for _, name := range relays {
			port := metricsPort(t, loadEnvConfig(t, name, c.Services[name].Environment).MetricsAddr)
			if want := name + ":" + port; !slices.Contains(targets, want) {
				t.Errorf("job %s scrapes %v, not %s", job, targets, want)
			}
		}
		prom := require("prometheus")
		mounted := map[string]string{}
		for _, v := range prom.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 {
				mounted[parts[1]] = parts[0]
			}
		}
		cfgDir := ""
		for target, src := range mounted {
			if filepath.Clean(src) == "prometheus/prometheus.yml" {
				cfgDir = filepath.Dir(target)
			}
		}
		for _, rf := range pc.RuleFiles {
			in := rf
			if !filepath.IsAbs(in) {
				in = filepath.Join(cfgDir, rf)
			}
			if filepath.Clean(mounted[in]) != "prometheus/alerts.yml" {
				t.Errorf("rule file %s resolves to %s in the container, where compose mounts %q", rf, in, mounted[in])
			}
		}
	})

	t.Run("Grafana gets the data source and the dashboard", func(t *testing.T) {
		g := require("grafana")
		mounts := map[string]string{}
		for _, v := range g.Volumes {
			parts := strings.Split(v, ":")
			mounts[filepath.Clean(parts[0])] = parts[1]
		}
		if mounts["grafana/provisioning"] != "/etc/grafana/provisioning" {
			t.Errorf("grafana/provisioning must be mounted at /etc/grafana/provisioning, got %v", mounts)
		}
		var prov struct {
			Providers []struct {
				Options struct {
					Path string `yaml:"path"`
				} `yaml:"options"`
			} `yaml:"providers"`
		}
		decodeYAML(t, "grafana/provisioning/dashboards/outbox-relay.yml", &prov)
		if len(prov.Providers) != 1 || prov.Providers[0].Options.Path != mounts["grafana/dashboards"] {
			t.Errorf("the dashboard provider reads %+v, compose mounts the dashboards at %q", prov.Providers, mounts["grafana/dashboards"])
		}
		var ds struct {
			Datasources []struct {
				Type string `yaml:"type"`
				URL  string `yaml:"url"`
			} `yaml:"datasources"`
		}
		decodeYAML(t, "grafana/provisioning/datasources/prometheus.yml", &ds)
		if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || !strings.Contains(ds.Datasources[0].URL, "//prometheus:9090") {
			t.Errorf("want one Prometheus data source at the compose prometheus service, got %+v", ds.Datasources)
		}
	})
}

func TestTheDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	df := parseDockerfile(t, "Dockerfile")
	if len(df.stages) < 2 {
		t.Fatalf("want a multi-stage build, got stages %v", df.stages)
	}
	builder, final := df.stages[0], df.stages[len(df.stages)-1]

	t.Run("the builder's Go is at least go.mod's", func(t *testing.T) {
		gomod, err := os.ReadFile("../go.mod")
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod))
		tag := regexp.MustCompile(`^golang:(\d+)\.(\d+)`).FindStringSubmatch(builder.image)
		if m == nil || tag == nil {
			t.Fatalf("cannot compare builder image %q with go.mod", builder.image)
		}
		if atoi(tag[1])*1000+atoi(tag[2]) < atoi(m[1])*1000+atoi(m[2]) {
			t.Errorf("builder image %s is older than go.mod's go %s.%s", builder.image, m[1], m[2])
		}
	})

	t.Run("the final image is distroless static or scratch and runs as non-root", func(t *testing.T) {
		if !strings.HasPrefix(final.image, "gcr.io/distroless/static") && final.image != "scratch" {
			t.Errorf("final base %s, want gcr.io/distroless/static* or scratch", final.image)
		}
		user, _, _ := strings.Cut(final.user, ":")
		if user == "" || user == "root" || user == "0" {
			t.Errorf("final stage USER %q, want a non-root user", final.user)
		}
	})

	// The binary the image ships: built exactly as the Dockerfile builds it.
	var buildCmd []string
	for _, run := range builder.runs {
		if words := shellWords(run); slices.Contains(words, "build") && slices.Contains(words, "go") {
			buildCmd = words
		}
	}
	if buildCmd == nil {
		t.Fatalf("the builder stage has no go build command (RUN lines %q)", builder.runs)
	}
	out := flagValue(buildCmd, "-o")
	if !slices.Contains(buildCmd, "./cmd/outbox-relay") {
		t.Errorf("the go build command %q does not build ./cmd/outbox-relay", buildCmd)
	}
	if !slices.Contains(buildCmd, "CGO_ENABLED=0") {
		t.Errorf("the go build command %q is not static (CGO_ENABLED=0): distroless static has no libc", buildCmd)
	}
	if src := final.copyFrom[builder.name]; src[0] != out {
		t.Errorf("the final stage copies %q from %s, the build writes %q", src[0], builder.name, out)
	} else if len(final.entrypoint) == 0 || final.entrypoint[0] != src[1] {
		t.Errorf("ENTRYPOINT %q does not run the copied binary %s", final.entrypoint, src[1])
	}

	// The build arguments as a build would pass them.
	stamps := strings.NewReplacer("${VERSION}", "deploy-test", "${COMMIT}", "5f2e3bf0a1b2c3d4e5f60718293a4b5c6d7e8f90",
		"${COMMIT_TIME}", "2026-12-06T19:40:00Z")

	t.Run("its go build command is the Makefile's, as make release builds", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-n", "build", "GO=go",
			"VERSION=deploy-test", "COMMIT=5f2e3bf0a1b2c3d4e5f60718293a4b5c6d7e8f90", "COMMIT_TIME=2026-12-06T19:40:00Z")
		cmd.Dir = ".."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make -n build: %v", err)
		}
		withoutOutput := func(words []string) []string {
			words = slices.Clone(words)
			if i := slices.Index(words, "-o"); i >= 0 && i+1 < len(words) {
				words = slices.Delete(words, i, i+2)
			}
			return words
		}
		var docker []string
		for _, w := range buildCmd {
			docker = append(docker, stamps.Replace(w))
		}
		if got, want := withoutOutput(docker), withoutOutput(shellWords(strings.TrimSpace(string(out)))); !slices.Equal(got, want) {
			t.Errorf("the Dockerfile builds with\n  %q\nthe Makefile (make build, make release) with\n  %q", got, want)
		}
	})

	t.Run("its go build command builds a static binary that reports its version", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "outbox-relay")
		var env, args []string
		for i, w := range buildCmd {
			switch {
			case strings.Contains(w, "=") && i < slices.Index(buildCmd, "go"):
				env = append(env, w)
			case i > slices.Index(buildCmd, "go"):
				args = append(args, stamps.Replace(w))
			}
		}
		args[slices.Index(args, "-o")+1] = bin
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), args...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("the binary needs a dynamic loader; it would not start on distroless static")
			}
		}
		v, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(v), "outbox-relay deploy-test\ncommit:      5f2e3bf0a1b2c3d4e5f60718293a4b5c6d7e8f90\ncommit time: 2026-12-06T19:40:00Z\n") {
			t.Errorf("outbox-relay version: %q, %v; want the version, commit and time stamped by -ldflags", v, err)
		}
	})
}

func TestTheKubernetesManifestsAreConsistent(t *testing.T) {
	var kust struct {
		Namespace string   `yaml:"namespace"`
		Resources []string `yaml:"resources"`
	}
	decodeYAML(t, "kubernetes/kustomization.yaml", &kust)
	objects := map[string]map[string]any{} // kind -> object
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		base := filepath.Base(f)
		optional := strings.Contains(base, ".example.") || base == "servicemonitor.yaml"
		if !optional && !slices.Contains(kust.Resources, base) {
			t.Errorf("%s is not listed in kustomization.yaml", base)
		}
		for _, doc := range readYAMLDocs(t, f) {
			obj, _ := doc.(map[string]any)
			kind, _ := obj["kind"].(string)
			meta, _ := obj["metadata"].(map[string]any)
			if obj["apiVersion"] == nil || kind == "" || meta["name"] == nil {
				t.Errorf("%s: every object needs apiVersion, kind and metadata.name", f)
				continue
			}
			if kind != "Namespace" && meta["namespace"] != kust.Namespace {
				t.Errorf("%s: %s namespace %v, want %s", f, kind, meta["namespace"], kust.Namespace)
			}
			objects[kind] = obj
		}
	}
	for _, r := range kust.Resources {
		if _, err := os.Stat(filepath.Join("kubernetes", r)); err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", r, err)
		}
	}
	for _, kind := range []string{"ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor", "ServiceAccount", "NetworkPolicy"} {
		if objects[kind] == nil {
			t.Fatalf("no %s among the manifests", kind)
		}
	}

	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	remarshal(t, objects["ConfigMap"], &cm)
	var dep struct {
		Spec struct {
			Replicas int `yaml:"replicas"`
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template struct {
				Metadata struct {
					Labels map[string]string `yaml:"labels"`
				} `yaml:"metadata"`
				Spec struct {
					TerminationGracePeriodSeconds int   `yaml:"terminationGracePeriodSeconds"`
					AutomountServiceAccountToken  *bool `yaml:"automountServiceAccountToken"`
					SecurityContext               struct {
						RunAsNonRoot   *bool `yaml:"runAsNonRoot"`
						RunAsUser      int   `yaml:"runAsUser"`
						FSGroup        int   `yaml:"fsGroup"`
						SeccompProfile struct {
							Type string `yaml:"type"`
						} `yaml:"seccompProfile"`
					} `yaml:"securityContext"`
					Containers []k8sContainer `yaml:"containers"`
					Volumes    []struct {
						Name      string `yaml:"name"`
						ConfigMap struct {
							Name string `yaml:"name"`
						} `yaml:"configMap"`
						Secret struct {
							SecretName  string `yaml:"secretName"`
							DefaultMode *int   `yaml:"defaultMode"`
						} `yaml:"secret"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	remarshal(t, objects["Deployment"], &dep)
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	ctr := pod.Containers[0]

	t.Run("the network policy admits only the metrics port, from the monitoring namespace", func(t *testing.T) {
		var np struct {
			Spec struct {
				PodSelector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"podSelector"`
				PolicyTypes []string `yaml:"policyTypes"`
				Ingress     []struct {
					From []struct {
						NamespaceSelector *struct {
							MatchLabels map[string]string `yaml:"matchLabels"`
						} `yaml:"namespaceSelector"`
						IPBlock any `yaml:"ipBlock"`
					} `yaml:"from"`
					Ports []struct {
						Port any `yaml:"port"`
					} `yaml:"ports"`
				} `yaml:"ingress"`
			} `yaml:"spec"`
		}
		remarshal(t, objects["NetworkPolicy"], &np)
		for k, v := range np.Spec.PodSelector.MatchLabels {
			if dep.Spec.Template.Metadata.Labels[k] != v {
				t.Errorf("podSelector %s=%s does not select the relay's pods (labels %v)", k, v, dep.Spec.Template.Metadata.Labels)
			}
		}
		if len(np.Spec.PodSelector.MatchLabels) == 0 || !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
			t.Errorf("the policy must select the relay's pods and restrict Ingress: %+v", np.Spec)
		}
		var metricsPort string
		for _, p := range ctr.Ports {
			if p.Name == "metrics" {
				metricsPort = p.Name
			}
		}
		for _, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("an ingress rule without from admits every source")
			}
			for _, f := range rule.From {
				if f.NamespaceSelector == nil || len(f.NamespaceSelector.MatchLabels) == 0 || f.IPBlock != nil {
					t.Errorf("ingress from %+v: want a namespace selector naming the monitoring namespace", f)
				}
			}
			if len(rule.Ports) != 1 || fmt.Sprint(rule.Ports[0].Port) != metricsPort {
				t.Errorf("ingress ports %+v: want only the container's %q port", rule.Ports, metricsPort)
			}
		}
		if len(np.Spec.Ingress) == 0 || metricsPort == "" {
			t.Errorf("want one ingress rule for the container's metrics port (ports %+v)", ctr.Ports)
		}
	})

	// The configuration the pod runs with: the ConfigMap's file named by --config, and the
	// environment, which holds no secret.
	configPath := flagValue(ctr.Args, "--config")
	var cfg *config.Config
	t.Run("the ConfigMap's relay.yaml loads", func(t *testing.T) {
		var mountPath string
		for _, vm := range ctr.VolumeMounts {
			for _, v := range pod.Volumes {
				if v.Name == vm.Name && v.ConfigMap.Name != "" && strings.HasPrefix(configPath, vm.MountPath+"/") {
					mountPath = vm.MountPath
				}
			}
		}
		key := strings.TrimPrefix(configPath, mountPath+"/")
		if mountPath == "" || cm.Data[key] == "" {
			t.Fatalf("--config %q is not a key of the mounted ConfigMap (keys %v)", configPath, mapKeys(cm.Data))
		}
		file := filepath.Join(t.TempDir(), key)
		if err := os.WriteFile(file, []byte(cm.Data[key]), 0o644); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, e := range ctr.Env {
			env[e.Name] = e.Value
		}
		cfg = loadConfig(t, []string{"--config", file}, env)
		if cfg.CreatePublication {
			t.Errorf("create_publication is on, but the relay's role does not own the table")
		}
	})
	if cfg == nil {
		t.FailNow()
	}

	t.Run("the secrets reach the pod as files of the Secret, read-only, never in the environment", func(t *testing.T) {
		var sec struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			StringData map[string]string `yaml:"stringData"`
		}
		remarshal(t, objects["Secret"], &sec)
		for _, e := range ctr.Env {
			if e.ValueFrom.SecretKeyRef.Key != "" || strings.Contains(e.Name, "PASSWORD") || strings.Contains(e.Name, "DSN") {
				t.Errorf("env %s: secrets go in files (the environment shows in `kubectl describe` and /proc)", e.Name)
			}
		}
		if u, err := url.Parse(cfg.PGDSN); err != nil || u.Query().Has("password") {
			t.Errorf("pg_dsn %q: want a URL without a password", cfg.PGDSN)
		} else if _, has := u.User.Password(); has {
			t.Errorf("pg_dsn %q holds a password: it belongs in pg_password_file", cfg.PGDSN)
		}
		var mountPath string
		for _, v := range pod.Volumes {
			if v.Secret.SecretName == "" {
				continue
			}
			if v.Secret.SecretName != sec.Metadata.Name {
				t.Errorf("volume %s mounts Secret %q, the example is %q", v.Name, v.Secret.SecretName, sec.Metadata.Name)
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				t.Errorf("volume %s: defaultMode must give others no access to the secret files", v.Name)
			}
			for _, vm := range ctr.VolumeMounts {
				if vm.Name != v.Name {
					continue
				}
				if !vm.ReadOnly || vm.SubPath != "" {
					t.Errorf("mount of %s: want readOnly and no subPath (a subPath mount never sees a rotated Secret)", v.Name)
				}
				mountPath = vm.MountPath
			}
		}
		if mountPath == "" {
			t.Fatalf("no Secret volume mounted in the container")
		}
		if pod.SecurityContext.FSGroup != pod.SecurityContext.RunAsUser {
			t.Errorf("fsGroup %d: the secret files belong to root and this group, so the relay's user %d must be in it",
				pod.SecurityContext.FSGroup, pod.SecurityContext.RunAsUser)
		}
		if cfg.PGPasswordFile == "" {
			t.Errorf("pg_password_file is not set: the PostgreSQL password must come from the Secret's file")
		}
		for key, path := range map[string]string{"pg_password_file": cfg.PGPasswordFile, "kafka.sasl.password_file": cfg.Kafka.SASL.PasswordFile} {
			if path == "" {
				continue
			}
			dir, name := filepath.Split(path)
			if filepath.Clean(dir) != filepath.Clean(mountPath) {
				t.Errorf("%s %s is not in the Secret's mount %s", key, path, mountPath)
			}
			if _, ok := sec.StringData[name]; !ok {
				t.Errorf("%s names %s, which secret.example.yaml does not document", key, name)
			}
		}
		// Every documented key is used, by a key set in relay.yaml or one shown commented out.
		for name := range sec.StringData {
			if !strings.Contains(cm.Data[strings.TrimPrefix(configPath, filepath.Dir(configPath)+"/")], mountPath+"/"+name) {
				t.Errorf("secret.example.yaml documents %s, which relay.yaml never names (%s/%s)", name, mountPath, name)
			}
		}
	})

	t.Run("two replicas that stop within the grace period", func(t *testing.T) {
		if dep.Spec.Replicas != 2 {
			t.Errorf("replicas %d, want 2 (leader and standby)", dep.Spec.Replicas)
		}
		if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= cfg.ShutdownTimeout {
			t.Errorf("terminationGracePeriodSeconds %s must exceed shutdown_timeout %s", grace, cfg.ShutdownTimeout)
		}
	})

	t.Run("the pod runs as the image's non-root user with a read-only root filesystem, no privilege escalation and no capabilities", func(t *testing.T) {
		sc := pod.SecurityContext
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == 0 {
			t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", sc)
		}
		if sc.SeccompProfile.Type != "RuntimeDefault" {
			t.Errorf("seccompProfile %q, want RuntimeDefault", sc.SeccompProfile.Type)
		}
		if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
			t.Errorf("automountServiceAccountToken must be false: the relay never calls the Kubernetes API")
		}
		user, _, _ := strings.Cut(parseDockerfile(t, "Dockerfile").stages[1].user, ":")
		if strconv.Itoa(sc.RunAsUser) != user {
			t.Errorf("runAsUser %d, the image's USER is %s", sc.RunAsUser, user)
		}
		c := ctr.SecurityContext
		if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
			t.Errorf("readOnlyRootFilesystem must be true")
		}
		if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
			t.Errorf("allowPrivilegeEscalation must be false")
		}
		if !slices.Contains(c.Capabilities.Drop, "ALL") {
			t.Errorf("capabilities must drop ALL")
		}
		if ctr.Resources.Limits["memory"] == "" || ctr.Resources.Requests["cpu"] == "" || ctr.Resources.Requests["memory"] == "" {
			t.Errorf("resources %+v: want cpu and memory requests and a memory limit", ctr.Resources)
		}
	})

	t.Run("the memory request holds what the relay keeps in flight, and the limit its peak", func(t *testing.T) {
		// docs/guarantees.md, "Bounded memory": expect roughly 22 MB + 2 to 3 x max_in_flight_bytes
		// (exactly-once's backlog drains peaked at 115-151 MB with the defaults). A request below
		// that lets the scheduler place the relay where it is evicted or OOM-killed mid-drain.
		const base = 22 << 20
		request := memoryQuantity(t, "requests.memory", ctr.Resources.Requests["memory"])
		limit := memoryQuantity(t, "limits.memory", ctr.Resources.Limits["memory"])
		if want := base + 2*cfg.MaxInFlightBytes; request < want {
			t.Errorf("memory request %s is below 22 MB + 2 x max_in_flight_bytes (%d MiB)", ctr.Resources.Requests["memory"], want>>20)
		}
		if want := base + 3*cfg.MaxInFlightBytes; limit < want {
			t.Errorf("memory limit %s is below 22 MB + 3 x max_in_flight_bytes (%d MiB)", ctr.Resources.Limits["memory"], want>>20)
		}
		for _, e := range ctr.Env {
			if e.Name != "GOMEMLIMIT" {
				continue
			}
			// The runtime collects harder as it nears GOMEMLIMIT: below the request it would spend
			// the drain collecting, at or above the limit it would never act before the OOM kill.
			if soft := memoryQuantity(t, "GOMEMLIMIT", e.Value); soft < request || soft >= limit {
				t.Errorf("GOMEMLIMIT %s: want it between the memory request %s and the limit %s",
					e.Value, ctr.Resources.Requests["memory"], ctr.Resources.Limits["memory"])
			}
		}
	})

	t.Run("the probes and the Service use the metrics port", func(t *testing.T) {
		port := metricsPort(t, cfg.MetricsAddr)
		var portName string
		for _, p := range ctr.Ports {
			if strconv.Itoa(p.ContainerPort) == port {
				portName = p.Name
			}
		}
		if portName == "" {
			t.Fatalf("no container port %s (metrics_addr %q)", port, cfg.MetricsAddr)
		}
		for name, probe := range map[string]k8sProbe{"liveness": ctr.LivenessProbe, "readiness": ctr.ReadinessProbe} {
			want := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name]
			if probe.HTTPGet.Path != want || (probe.HTTPGet.Port != portName && probe.HTTPGet.Port != port) {
				t.Errorf("%s probe %+v, want GET %s on port %s", name, probe.HTTPGet, want, portName)
			}
		}
		var svc struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				Selector map[string]string `yaml:"selector"`
				Ports    []struct {
					Name       string `yaml:"name"`
					TargetPort string `yaml:"targetPort"`
				} `yaml:"ports"`
			} `yaml:"spec"`
		}
		remarshal(t, objects["Service"], &svc)
		if svc.Metadata.Name != job {
			t.Errorf("Service %q: the ServiceMonitor's job label is the Service name, and the alerts select job=%q", svc.Metadata.Name, job)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != portName {
			t.Errorf("Service ports %+v, want one targeting %s", svc.Spec.Ports, portName)
		}
		if !subset(svc.Spec.Selector, dep.Spec.Template.Metadata.Labels) {
			t.Errorf("Service selector %v does not select the pods (%v)", svc.Spec.Selector, dep.Spec.Template.Metadata.Labels)
		}
		var sm struct {
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"selector"`
				Endpoints []struct {
					Port string `yaml:"port"`
					Path string `yaml:"path"`
				} `yaml:"endpoints"`
			} `yaml:"spec"`
		}
		remarshal(t, objects["ServiceMonitor"], &sm)
		svcLabels := map[string]string{}
		if meta, ok := objects["Service"]["metadata"].(map[string]any); ok {
			if l, ok := meta["labels"].(map[string]any); ok {
				for k, v := range l {
					svcLabels[k] = fmt.Sprint(v)
				}
			}
		}
		if !subset(sm.Spec.Selector.MatchLabels, svcLabels) || len(sm.Spec.Endpoints) != 1 ||
			sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor %+v does not scrape /metrics on the Service's port", sm.Spec)
		}
	})

	t.Run("the disruption budget keeps one replica", func(t *testing.T) {
		var pdb struct {
			Spec struct {
				MinAvailable int `yaml:"minAvailable"`
				Selector     struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"selector"`
			} `yaml:"spec"`
		}
		remarshal(t, objects["PodDisruptionBudget"], &pdb)
		if pdb.Spec.MinAvailable < 1 || pdb.Spec.MinAvailable >= dep.Spec.Replicas {
			t.Errorf("minAvailable %d: want at least 1 and fewer than the %d replicas (or drains block)", pdb.Spec.MinAvailable, dep.Spec.Replicas)
		}
		if !subset(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels) {
			t.Errorf("PodDisruptionBudget selector %v does not select the pods", pdb.Spec.Selector.MatchLabels)
		}
		if !subset(dep.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels) {
			t.Errorf("Deployment selector %v does not select its own pods", dep.Spec.Selector.MatchLabels)
		}
	})
}

func TestTheExampleConfigurationListsEveryKeyWithItsDefault(t *testing.T) {
	cfg := loadConfig(t, []string{"--config", "config.example.yaml"}, nil)
	if cfg.PGDSN == "" || len(cfg.KafkaBrokers) == 0 {
		t.Fatalf("the example must set the required keys")
	}
	values := map[string]string{}
	var doc map[string]any
	decodeYAML(t, "config.example.yaml", &doc)
	flattenYAML("", doc, values)

	required := map[string]bool{"pg_dsn": true, "kafka_brokers": true}
	known := map[string]bool{}
	for _, k := range config.Keys() {
		known[k.Name] = true
		v, ok := values[k.Name]
		if !ok {
			t.Errorf("config.example.yaml does not list %s (%s)", k.Name, k.Help)
			continue
		}
		if !required[k.Name] && v != k.Default {
			t.Errorf("config.example.yaml sets %s to %q; the default is %q", k.Name, v, k.Default)
		}
	}
	for k := range values {
		if !known[k] {
			t.Errorf("config.example.yaml lists %s, which is not a key", k)
		}
	}
	if len(known) < 30 {
		t.Errorf("found %d keys, config.Keys changed shape", len(known))
	}
}

// --- helpers ---------------------------------------------------------------------------------------

type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Build       *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	DependsOn       dependsOn `yaml:"depends_on"`
	StopGracePeriod string    `yaml:"stop_grace_period"`
	ReadOnly        bool      `yaml:"read_only"`
	Ports           []string  `yaml:"ports"`
}

// dependsOn is compose's depends_on, written either as a list or as a map of conditions.
type dependsOn map[string]any

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*d)[name] = nil
		}
		return nil
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		(*d)[k] = v
	}
	return nil
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Args []string `yaml:"args"`
	Env  []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom struct {
			SecretKeyRef struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

func readYAMLDocs(t *testing.T, path string) []any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []any
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return docs
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}

func decodeYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func remarshal(t *testing.T, from, into any) {
	t.Helper()
	data, err := yaml.Marshal(from)
	if err == nil {
		err = yaml.Unmarshal(data, into)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// loadConfig runs the relay's own loader on args, with env as the only environment (never the test
// process's, which may carry OUTBOX_* variables of its own).
func loadConfig(t *testing.T, args []string, env map[string]string) *config.Config {
	t.Helper()
	fs := flag.NewFlagSet("outbox-relay run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	loader := config.NewLoader(fs, func(k string) string { return env[k] })
	if err := fs.Parse(args); err != nil {
		t.Fatalf("flags %v: %v", args, err)
	}
	cfg, err := loader.Load()
	if err != nil {
		t.Fatalf("the relay would refuse this configuration: %v", err)
	}
	return cfg
}

// loadEnvConfig loads a compose service's environment, after checking each OUTBOX_ variable is a key.
func loadEnvConfig(t *testing.T, service string, env map[string]string) *config.Config {
	t.Helper()
	known := map[string]bool{}
	for _, k := range config.Keys() {
		known[k.Env()] = true
	}
	for k := range env {
		if strings.HasPrefix(k, "OUTBOX_") && !known[k] {
			t.Errorf("service %s sets %s, which is not a configuration key", service, k)
		}
	}
	return loadConfig(t, nil, env)
}

func flattenYAML(prefix string, v any, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			if prefix != "" {
				k = prefix + "." + k
			}
			flattenYAML(k, sub, out)
		}
	case []any:
		parts := make([]string, len(v))
		for i, item := range v {
			parts[i] = fmt.Sprint(item)
		}
		out[prefix] = strings.Join(parts, ",")
	case nil:
		out[prefix] = ""
	default:
		out[prefix] = fmt.Sprint(v)
	}
}

func metricsPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		t.Fatalf("metrics_addr %q: want host:port or :port (%v)", addr, err)
	}
	return port
}

func imageMajor(t *testing.T, image, repo string) int {
	t.Helper()
	name, tag, _ := strings.Cut(image, ":")
	major, _, _ := strings.Cut(tag, ".")
	n, err := strconv.Atoi(major)
	if name != repo || err != nil {
		t.Errorf("image %q: want %s:<version>", image, repo)
	}
	return n
}

func subset(sub, of map[string]string) bool {
	if len(sub) == 0 {
		return false
	}
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}

func mapKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// --- metrics -----------------------------------------------------------------------------------

// recorder is a Registerer that keeps what it registers, so the descriptors of vectors with no
// children yet (which Gather does not return) are known too.
type recorder struct {
	reg        *prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.reg.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// knownSeries returns every series name the relay's /metrics can carry (metrics.New plus the Go and
// process collectors run.go adds; a histogram's _bucket, _sum and _count) with its label names.
func knownSeries(t *testing.T) map[string][]string {
	t.Helper()
	rec := &recorder{reg: prometheus.NewRegistry()}
	metrics.New(rec)
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	known := map[string][]string{}
	add := func(name string, labels []string, histogram bool) {
		if histogram {
			known[name+"_bucket"] = append(slices.Clone(labels), "le")
			known[name+"_sum"] = labels
			known[name+"_count"] = labels
			return
		}
		known[name] = labels
	}
	descRe := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	for _, c := range rec.collectors {
		histogram := false
		switch c.(type) {
		case *prometheus.HistogramVec:
			histogram = true
		default:
			ch := make(chan prometheus.Metric, 16)
			go func() { c.Collect(ch); close(ch) }()
			for m := range ch {
				var pb dto.Metric
				if err := m.Write(&pb); err == nil && pb.Histogram != nil {
					histogram = true
				}
			}
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descRe.FindStringSubmatch(d.String())
			if m == nil {
				continue // the Go collector describes some metrics only when gathered
			}
			var labels []string
			for _, l := range strings.Split(m[2], ",") {
				// A constrained label prints as c(name).
				l = strings.TrimSpace(l)
				if inner, ok := strings.CutPrefix(l, "c("); ok {
					l = strings.TrimSuffix(inner, ")")
				}
				if l != "" {
					labels = append(labels, l)
				}
			}
			add(m[1], labels, histogram)
		}
	}
	families, err := rec.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if _, ok := known[f.GetName()]; ok {
			continue
		}
		var labels []string
		if len(f.GetMetric()) > 0 {
			for _, lp := range f.GetMetric()[0].GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		add(f.GetName(), labels, f.GetType() == dto.MetricType_HISTOGRAM)
	}
	if _, ok := known["outbox_relay_events_published_total"]; !ok {
		t.Fatalf("metrics.New registered no outbox_relay_events_published_total; known: %v", known)
	}
	return known
}

// --- alerts ------------------------------------------------------------------------------------

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	decodeYAML(t, "prometheus/alerts.yml", &f)
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

func alertExprs(t *testing.T) []string {
	var exprs []string
	for _, r := range alertRules(t) {
		exprs = append(exprs, r.Expr)
	}
	return exprs
}

// firingTests returns the alerts that alerts_test.yml expects to fire at least once.
func firingTests(t *testing.T) map[string]bool {
	t.Helper()
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	decodeYAML(t, "prometheus/alerts_test.yml", &f)
	fired := map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fired[a.Alertname] = true
			}
		}
	}
	return fired
}

// markdownAnchors returns the GitHub anchors of a document's headings.
func markdownAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	drop := regexp.MustCompile("[^a-z0-9 _-]")
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		h = drop.ReplaceAllString(h, "")
		anchors[strings.ReplaceAll(h, " ", "-")] = true
	}
	return anchors
}

// --- dashboard ---------------------------------------------------------------------------------

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("grafana/dashboards/outbox-relay.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(d.Panels) == 0 {
		t.Fatalf("dashboard has no panels")
	}
	return d
}

// dashboardExprs returns every PromQL expression of the dashboard: panel targets and the
// label_values() queries of its variables (their inner selector).
func dashboardExprs(d dashboard) []string {
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	lv := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_]+\)$`)
	for _, v := range d.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if v.Type != "query" || json.Unmarshal(v.Query, &q) != nil {
			continue
		}
		if m := lv.FindStringSubmatch(q.Query); m != nil {
			exprs = append(exprs, m[1])
		}
	}
	return exprs
}

// --- Dockerfile --------------------------------------------------------------------------------

type dockerStage struct {
	name, image, user string
	runs              []string
	copyFrom          map[string][2]string // stage -> {source, destination}
	entrypoint        []string
}

type dockerfile struct{ stages []*dockerStage }

func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	var df dockerfile
	var cur *dockerStage
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			f := strings.Fields(rest)
			cur = &dockerStage{image: f[0], copyFrom: map[string][2]string{}}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				cur.name = f[2]
			}
			df.stages = append(df.stages, cur)
		case "RUN":
			cur.runs = append(cur.runs, rest)
		case "USER":
			cur.user = rest
		case "COPY":
			f := strings.Fields(rest)
			if len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				cur.copyFrom[strings.TrimPrefix(f[0], "--from=")] = [2]string{f[1], f[2]}
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &cur.entrypoint); err != nil {
				t.Errorf("ENTRYPOINT %s: want the exec (JSON) form so signals reach the relay: %v", rest, err)
			}
		}
	}
	if len(df.stages) == 0 {
		t.Fatalf("%s has no FROM", path)
	}
	return df
}

// shellWords splits a simple shell command line: words, and double-quoted strings.
func shellWords(s string) []string {
	var words []string
	var b strings.Builder
	inQuote, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote, inWord = !inQuote, true
		case (r == ' ' || r == '\t') && !inQuote:
			if inWord {
				words = append(words, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, b.String())
	}
	return words
}

func flagValue(words []string, name string) string {
	if i := slices.Index(words, name); i >= 0 && i+1 < len(words) {
		return words[i+1]
	}
	return ""
}

// memoryQuantity reads a Kubernetes memory quantity (128Mi, 1G, 1048576) or a GOMEMLIMIT value
// (400MiB), in bytes.
func memoryQuantity(t *testing.T, what, v string) int64 {
	t.Helper()
	units := []struct {
		suffix string
		factor int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1},
	}
	num, factor := v, int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			num, factor = n, u.factor
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("%s %q is not a memory quantity this test reads", what, v)
	}
	return n * factor
}

// TestTheShardOverlaysAreConsistent checks the example of a sharded outbox (docs/scaling.md): each
// shard is the base manifests in a namespace of its own (the alerts count leaders by job and
// namespace) with a relay.yaml that differs from the base's only in slot, publication and table,
// and no two shards share any of them (the slot names the leader lock and the default
// transactional_id: a shared one would make two shards one leader, or fence each other's producer).
func TestTheShardOverlaysAreConsistent(t *testing.T) {
	var base struct {
		Namespace string `yaml:"namespace"`
	}
	decodeYAML(t, "kubernetes/kustomization.yaml", &base)
	var baseCM struct {
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
	}
	decodeYAML(t, "kubernetes/configmap.yaml", &baseCM)
	var baseDoc any
	if err := yaml.Unmarshal([]byte(baseCM.Data["relay.yaml"]), &baseDoc); err != nil {
		t.Fatalf("kubernetes/configmap.yaml relay.yaml: %v", err)
	}
	baseKeys := map[string]string{}
	flattenYAML("", baseDoc, baseKeys)
	perShard := map[string]bool{"slot": true, "publication": true, "table": true}

	dirs, err := filepath.Glob("kubernetes-shards/*/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 2 {
		t.Fatalf("found %d shard overlays under kubernetes-shards/, want at least two", len(dirs))
	}
	seen := map[string]string{} // "slot=x" and the like -> the shard that uses it
	for _, kpath := range dirs {
		dir := filepath.Dir(kpath)
		var kust struct {
			Namespace string   `yaml:"namespace"`
			Resources []string `yaml:"resources"`
			Patches   []struct {
				Path string `yaml:"path"`
			} `yaml:"patches"`
		}
		decodeYAML(t, kpath, &kust)
		if !slices.Equal(kust.Resources, []string{"../../kubernetes"}) {
			t.Errorf("%s: resources %v, want the base manifests alone (../../kubernetes)", kpath, kust.Resources)
		}
		if kust.Namespace == "" || kust.Namespace == base.Namespace {
			t.Errorf("%s: namespace %q, want one of the shard's own (the alerts count leaders per namespace)", kpath, kust.Namespace)
		}
		if prev, ok := seen["namespace="+kust.Namespace]; ok {
			t.Errorf("%s and %s share namespace %q", prev, dir, kust.Namespace)
		}
		seen["namespace="+kust.Namespace] = dir
		if len(kust.Patches) != 1 {
			t.Fatalf("%s: want one patch, the shard's ConfigMap; got %+v", kpath, kust.Patches)
		}
		var cm struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Data map[string]string `yaml:"data"`
		}
		decodeYAML(t, filepath.Join(dir, kust.Patches[0].Path), &cm)
		if cm.Kind != "ConfigMap" || cm.Metadata.Name != baseCM.Metadata.Name {
			t.Errorf("%s: the patch is %s %q, want the base's ConfigMap %q", dir, cm.Kind, cm.Metadata.Name, baseCM.Metadata.Name)
		}
		file := filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(file, []byte(cm.Data["relay.yaml"]), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := loadConfig(t, []string{"--config", file}, nil)
		if cfg.TransactionalID != "" {
			t.Errorf("%s: transactional_id %q is set; leave it to derive from the shard's slot", dir, cfg.TransactionalID)
		}
		for key, v := range map[string]string{"slot": cfg.Slot, "publication": cfg.Publication, "table": cfg.Table} {
			if prev, ok := seen[key+"="+v]; ok {
				t.Errorf("%s and %s share %s %q: each shard needs its own", prev, dir, key, v)
			}
			seen[key+"="+v] = dir
		}
		var doc any
		if err := yaml.Unmarshal([]byte(cm.Data["relay.yaml"]), &doc); err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{}
		flattenYAML("", doc, keys)
		for k, v := range baseKeys {
			if !perShard[k] && keys[k] != v {
				t.Errorf("%s: %s is %q, the base's %q: only slot, publication and table differ between shards", dir, k, keys[k], v)
			}
		}
		for k := range keys {
			if _, ok := baseKeys[k]; !ok {
				t.Errorf("%s: sets %s, which the base relay.yaml does not", dir, k)
			}
		}
	}
}
