package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Exit statuses. A usage error has its own, so that a script can tell a
// mistyped command line from a command that ran and failed, and from
// reconcile's "problems found".
const (
	exitFailure  = 1  // the command failed (main's default for any error)
	exitProblems = 2  // reconcile found problems
	exitUsage    = 64 // EX_USAGE (sysexits.h): the command line is wrong; the usage goes to stderr
)

// exitError carries a process exit status other than 1, or an error the
// daemon's log already reported (logged): main then prints nothing more.
// A usage error carries the usage to print after the message.
type exitError struct {
	code   int
	err    error
	logged bool
	usage  string
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is a wrong command line: exit status 64, the message, then usage.
func usageError(usage, format string, a ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, a...), usage: usage}
}

// cmdSpec is one command of the table: its place on the command line, its
// usage and its flags, and what it runs. The usage is generated from it
// (flags from the very flag set the command parses), so the two agree.
type cmdSpec struct {
	name, sub string
	synopsis  string // the arguments, for the usage ("\n" continues the line)
	summary   string // one line
	details   string // more for the command's own usage: output fields, exit status
	takesArgs bool   // positional arguments allowed; else any is a usage error
	// flags declares the command's flags on fs and returns what runs the
	// command once they are parsed.
	flags func(fs *flag.FlagSet) runFunc
}

// runFunc runs a parsed command.
type runFunc func(ctx context.Context, c *cmdLine) error

// noFlags is the flags of a command that has none but --config.
func noFlags(fn runFunc) func(*flag.FlagSet) runFunc {
	return func(*flag.FlagSet) runFunc { return fn }
}

// commands is the command table, in the order of the usage; each group's
// entries live in its own file (cmd_*.go).
var commands = slices.Concat(migrateCommands, runCommands, dlqCommands, reconcileCommands, pruneCommands, traceCommands, hostCommands)

// cmdLine is one parsed command line, and what the command runs with.
type cmdLine struct {
	spec       *cmdSpec
	run        runFunc  // the command, its flags parsed
	args       []string // positional arguments
	configPath string
	mustExist  bool              // --config given: the file must exist
	help       string            // help, -h, --help: print this and exit 0
	env        map[string]string // the process environment
	out        io.Writer         // output and logs
}

// config loads the configuration the command line names.
func (c *cmdLine) config() (*Config, error) {
	return loadConfig(c.configPath, c.mustExist, c.env)
}

// usageError is a usage error of this command, with its usage.
func (c *cmdLine) usageError(format string, a ...any) error {
	return usageError(c.spec.usage(), format, a...)
}

func (s *cmdSpec) path() string { return strings.TrimSpace(s.name + " " + s.sub) }

// flagSet is the command's flag set, with --config, and what runs it.
func (s *cmdSpec) flagSet() (*flag.FlagSet, *string, runFunc) {
	fs := flag.NewFlagSet("paysvc "+s.path(), flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error is returned, the usage printed once by main
	cfg := fs.String("config", "", "the config `FILE` (as before the command)")
	return fs, cfg, s.flags(fs)
}

// usage is the command's own usage: synopsis, summary, details, flags.
func (s *cmdSpec) usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: paysvc [--config FILE] %s\n\n%s\n", s.head("\n    "), s.summary)
	if s.details != "" {
		fmt.Fprintf(&b, "\n%s\n", strings.TrimRight(s.details, "\n"))
	}
	fs, _, _ := s.flagSet()
	b.WriteString("\nflags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		if len(line) > 24 {
			line += "\n" + strings.Repeat(" ", 24)
		}
		fmt.Fprintf(&b, "%-24s  %s", line, text)
		if !slices.Contains([]string{"", "0", "false"}, f.DefValue) {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		b.WriteString("\n")
	})
	return b.String()
}

// head is the command with its synopsis; cont continues a long one.
func (s *cmdSpec) head(cont string) string {
	return strings.ReplaceAll(strings.TrimSpace(s.path()+" "+s.synopsis), "\n", cont)
}

// usage is the whole program's usage, from the command table.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: paysvc [--config FILE] <command> [arguments]\n\ncommands:\n")
	line := func(head, summary string) {
		if len(head) > 22 {
			fmt.Fprintf(&b, "  %s\n  %22s  %s\n", head, "", summary)
		} else {
			fmt.Fprintf(&b, "  %-22s  %s\n", head, summary)
		}
	}
	for _, s := range commands {
		line(s.head("\n      "), s.summary)
	}
	line("help [COMMAND [SUB]]", "this text, or a command's usage with its flags (as COMMAND -h)")
	b.WriteString(`
--config defaults to ./config.yaml (optional unless given); it may also come
among the command's flags. Every key can be overridden by
PAYSVC_<SECTION>_<KEY>, or PAYSVC_<SECTION>_<KEY>_FILE.

exit status: 0 done; 1 failed; 2 reconcile found problems; 64 usage error
(the command line is wrong: the usage goes to stderr).
`)
	return b.String()
}

// group is the commands named name (dlq: its subcommands).
func group(name string) []*cmdSpec {
	var g []*cmdSpec
	for _, s := range commands {
		if s.name == name {
			g = append(g, s)
		}
	}
	return g
}

// groupUsage is the usage of every command of a group.
func groupUsage(g []*cmdSpec) string {
	if len(g) == 1 {
		return g[0].usage()
	}
	subs := make([]string, len(g))
	for i, s := range g {
		subs[i] = s.sub
	}
	var b strings.Builder
	fmt.Fprintf(&b, "usage: paysvc [--config FILE] %s %s [arguments]\n", g[0].name, strings.Join(subs, "|"))
	for _, s := range g {
		b.WriteString("\n" + strings.Repeat("-", 72) + "\n")
		b.WriteString(s.usage())
	}
	return b.String()
}

func isHelp(arg string) bool { return slices.Contains([]string{"-h", "-help", "--help"}, arg) }

// find resolves NAME [SUB] to a command; rest is what follows. A group
// without its subcommand, or with -h, is answered with the group's usage.
func find(args []string) (spec *cmdSpec, rest []string, help string, err error) {
	g := group(args[0])
	if len(g) == 0 {
		return nil, nil, "", usageError(usage(), "unknown command %q", args[0])
	}
	if g[0].sub == "" {
		return g[0], args[1:], "", nil
	}
	name, subs := g[0].name, make([]string, len(g))
	for i, s := range g {
		subs[i] = s.sub
	}
	switch {
	case len(args) < 2:
		return nil, nil, "", usageError(groupUsage(g), "%s: want %s or %s", name,
			strings.Join(subs[:len(subs)-1], ", "), subs[len(subs)-1])
	case isHelp(args[1]):
		return nil, nil, groupUsage(g), nil
	}
	for _, s := range g {
		if s.sub == args[1] {
			return s, args[2:], "", nil
		}
	}
	return nil, nil, "", usageError(groupUsage(g), "%s: unknown subcommand %q", name, args[1])
}

// helpFor is the usage `paysvc help [COMMAND [SUB]]` asks for.
func helpFor(args []string) (string, error) {
	if len(args) == 0 {
		return usage(), nil
	}
	g := group(args[0])
	switch {
	case len(g) == 0:
		return "", usageError(usage(), "help: unknown command %q", args[0])
	case len(args) == 1:
		return groupUsage(g), nil
	case len(args) > 2:
		return "", usageError(groupUsage(g), "help: too many arguments")
	}
	for _, s := range g {
		if s.sub != "" && s.sub == args[1] {
			return s.usage(), nil
		}
	}
	return "", usageError(groupUsage(g), "help: %s has no subcommand %q", args[0], args[1])
}

// parseCommand reads [--config FILE] NAME [SUB] and the command's flags,
// which may come before or after its positional arguments; --config may
// also come among the command's flags. help, -h and --help, before or after
// a command, ask for the usage.
func parseCommand(args []string) (*cmdLine, error) {
	global := flag.NewFlagSet("paysvc", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	globalCfg := global.String("config", "", "config file")
	if err := global.Parse(args); errors.Is(err, flag.ErrHelp) {
		return &cmdLine{help: usage()}, nil
	} else if err != nil {
		return nil, usageError(usage(), "%v", err)
	}
	rest := global.Args()
	if len(rest) == 0 {
		return nil, usageError(usage(), "no command")
	}
	if rest[0] == "help" {
		help, err := helpFor(rest[1:])
		return &cmdLine{help: help}, err
	}
	spec, rest, help, err := find(rest)
	if err != nil || help != "" {
		return &cmdLine{help: help}, err
	}
	fs, cmdCfg, runner := spec.flagSet()
	c := &cmdLine{spec: spec, run: runner, configPath: "config.yaml"}
	for {
		if err := fs.Parse(rest); errors.Is(err, flag.ErrHelp) {
			return &cmdLine{help: spec.usage()}, nil
		} else if err != nil {
			return nil, c.usageError("%s: %v", spec.path(), err)
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		c.args, rest = append(c.args, rest[0]), rest[1:]
	}
	if len(c.args) > 0 && !spec.takesArgs {
		return nil, c.usageError("%s: unexpected arguments %q", spec.path(), c.args)
	}
	for _, p := range []string{*globalCfg, *cmdCfg} {
		if p != "" {
			c.configPath, c.mustExist = p, true
		}
	}
	return c, nil
}
