package doclinks

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is where the module's go.mod is, seen from this package.
const repoRoot = "../.."

var (
	// markdownLink matches [text](target) and ![alt](target); the target ends at the first
	// closing parenthesis or space (a title after it is ignored).
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// repoURL matches links to this repository's files on GitHub, in any text file.
	repoURL = regexp.MustCompile(`https://github\.com/outbox-relay/outbox-relay/blob/main/([^)\s#"'>]+)(#[A-Za-z0-9_-]+)?`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	// testLink matches a link whose text names a test and whose target is a test file:
	// [`TestX`](../pkg/x_test.go), also with a package prefix (`pkg.TestX`).
	testLink = regexp.MustCompile("\\[`(?:[A-Za-z0-9_/.-]+\\.)?(Test[A-Za-z0-9_]+)`\\]\\(([^)#\\s]+_test\\.go)\\)")
)

// TestEveryInternalLinkResolves reads every Markdown file of the repository (and the GitHub
// links of its YAML and Go files) and fails for each link whose file or heading is missing.
func TestEveryInternalLinkResolves(t *testing.T) {
	anchors := map[string]map[string]bool{} // file (relative to the root) -> its headings' anchors
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		a := headingAnchors(t, filepath.Join(repoRoot, rel))
		anchors[rel] = a
		return a
	}
	checked := 0
	check := func(from, target string) {
		checked++
		path, fragment, _ := strings.Cut(target, "#")
		rel := from
		if path != "" {
			rel = filepath.Clean(filepath.Join(filepath.Dir(from), path))
			if strings.HasPrefix(rel, "..") {
				t.Errorf("%s: link %q leaves the repository", from, target)
				return
			}
			if _, err := os.Stat(filepath.Join(repoRoot, rel)); err != nil {
				t.Errorf("%s: link %q names %s, which does not exist", from, target, rel)
				return
			}
		}
		if fragment == "" || !strings.HasSuffix(rel, ".md") {
			return
		}
		if !anchorsOf(rel)[fragment] {
			t.Errorf("%s: link %q: %s has no heading with the anchor #%s", from, target, rel, fragment)
		}
	}
	err := filepath.WalkDir(repoRoot, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != repoRoot && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(name)
		if ext != ".md" && ext != ".yml" && ext != ".yaml" && ext != ".go" {
			return nil
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range repoURL.FindAllStringSubmatch(string(data), -1) {
			check("", m[1]+m[2])
		}
		if ext != ".md" {
			return nil
		}
		for _, m := range testLink.FindAllStringSubmatch(string(data), -1) {
			checkTest(t, rel, m[1], filepath.Clean(filepath.Join(filepath.Dir(rel), m[2])))
		}
		for _, line := range outsideCode(string(data)) {
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				check(rel, target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d links: the walk missed the documentation", checked)
	}
}

// checkTest fails when the test file a link names does not define the test the link's text names:
// a table that says "shown by TestX" must point at a TestX that exists.
func checkTest(t *testing.T, from, name, file string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		return // the link check reports the missing file
	}
	if !strings.Contains(string(src), "func "+name+"(") {
		t.Errorf("%s: the link to %s names %s, which that file does not define", from, file, name)
	}
}

// outsideCode returns the lines of a Markdown text that are not in fenced code blocks, with
// inline code spans removed: a link shown as code is an example, not a link.
func outsideCode(text string) []string {
	var lines []string
	inFence := false
	inlineCode := regexp.MustCompile("`[^`]*`")
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if !inFence {
			lines = append(lines, inlineCode.ReplaceAllString(line, ""))
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown file.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		a := slug(m[1])
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// slug is GitHub's anchor for a heading: lower case, spaces to hyphens, every other character
// that is not a letter, a digit, a hyphen or an underscore dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestEveryTestTheDocumentationNamesExists fails for each test, fuzz test or benchmark a Markdown
// file names (in code, as the tables of docs/guarantees.md do: `TestX`, `pkg.TestX`,
// `TestX/subtest`) that no _test.go file of the repository defines: a guarantee "shown by" a test
// that is gone is shown by nothing.
func TestEveryTestTheDocumentationNamesExists(t *testing.T) {
	defined := map[string]bool{}
	named := map[string][]string{} // test name -> the files that name it
	funcDecl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)\(`)
	mention := regexp.MustCompile(`\b((?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*)`)
	err := filepath.WalkDir(repoRoot, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != repoRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		isTest, isDoc := strings.HasSuffix(p, "_test.go"), strings.HasSuffix(p, ".md")
		if !isTest && !isDoc {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if isTest {
			for _, m := range funcDecl.FindAllStringSubmatch(string(data), -1) {
				defined[m[1]] = true
			}
			return nil
		}
		rel, _ := filepath.Rel(repoRoot, p)
		for _, m := range mention.FindAllStringSubmatch(string(data), -1) {
			named[m[1]] = append(named[m[1]], rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 100 || len(named) < 100 {
		t.Fatalf("found %d tests and %d names in the documentation: the walk missed the repository", len(defined), len(named))
	}
	for name, files := range named {
		if !defined[name] {
			t.Errorf("%s name %s, which no test file defines", strings.Join(slicesCompact(files), ", "), name)
		}
	}
}

// slicesCompact returns the distinct values of a sorted-by-appearance list, in order.
func slicesCompact(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func TestSlugIsGitHubs(t *testing.T) {
	for _, c := range []struct{ heading, anchor string }{
		{"Polling mode (source: poll)", "polling-mode-source-poll"},
		{"Stopping: SIGTERM and fencing", "stopping-sigterm-and-fencing"},
		{"Broker cost and latency: `kafka.linger`", "broker-cost-and-latency-kafkalinger"},
		{"The claim survives an empty queue's statistics", "the-claim-survives-an-empty-queues-statistics"},
		{"Lost slot, no lost events", "lost-slot-no-lost-events"},
	} {
		if got := slug(c.heading); got != c.anchor {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.anchor)
		}
	}
}
