//! `vvm man`: the manual page (roff), generated from the parser's own definition, with a section
//! per subcommand on the same page, and the EXAMPLES and ENVIRONMENT a manual page has.

use std::collections::BTreeMap;

/// What a script does with `vvm`, one example each (the README's table has the same jobs).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "Run a command while this process leads slot 1; a second one waits and takes over:",
        "vvm run --store sqlite:/var/lib/app/vvm.sqlite -- ./worker --flag",
    ),
    (
        "Try once from cron; exit 75 when someone else runs it (the command never ran):",
        "vvm run --acquire 0 --busy-code 75 -- ./nightly-job",
    ),
    (
        "Give up after 10 seconds of waiting:",
        "vvm run --acquire 10s -- ./job",
    ),
    (
        "At most 3 at once, the semaphore made if missing:",
        "vvm run --semaphore pool --limit 3 -- ./job",
    ),
    (
        "Hold the slot around several commands of a bash script (the fencing token on one line):",
        "coproc vvm run --hold; read -r token <&\"${COPROC[0]}\"; ./step1; ./step2; kill \"$COPROC_PID\"",
    ),
    ("Watch who leads:", "vvm status --watch"),
];

/// Variables read besides the flags' own (each flag's is listed from the parser).
const OTHER_VARIABLES: &[(&str, &str)] = &[
    (
        "RUST_LOG",
        "When set and not empty, filters the log lines instead of --log-level (e.g. warn,vvm_runtime=debug).",
    ),
    ("NO_COLOR", "When set, log lines are never coloured."),
    (
        "XDG_STATE_HOME",
        "The default store is sqlite:$XDG_STATE_HOME/vvm/vvm.sqlite (else ~/.local/state/vvm/vvm.sqlite).",
    ),
    (
        "NOTIFY_SOCKET",
        "Set by systemd (Type=notify): vvm run sends READY=1 once it leads, STATUS= lines and watchdog pings.",
    ),
    (
        "VVM_FENCING_TOKEN",
        "Set for the command of vvm run (with VVM_SLOT and VVM_ADDRESS): its fencing token, <slot>:<revision> (slot 0 for a semaphore grant). The revision is the store's number for the write that won the slot, so only the order of one slot's tokens means anything: a later tenure's is higher. Pass it with the command's writes so that a resource can refuse a former holder's.",
    ),
];

/// The page: `command`'s sections, then each visible subcommand's under a heading of its own,
/// then EXAMPLES and ENVIRONMENT.
pub fn render(command: &clap::Command) -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    // The subcommands are sections of this page, not pages of their own: `vvm\-run(1)` would
    // point to a page that is never installed.
    let mut page = String::from_utf8_lossy(&page).into_owned();
    for sub in command.get_subcommands() {
        let name = sub.get_name().replace('-', "\\-");
        page = page.replace(&format!("vvm\\-{name}(1)"), &format!("\\fBvvm {name}\\fR"));
    }
    page = page.replace("vvm\\-help(1)", "\\fBvvm help\\fR");
    let mut page = page.into_bytes();
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let name = format!("vvm-{}", sub.get_name());
        let sub = sub.clone().display_name(name.clone()).bin_name(name);
        let mut section = Vec::new();
        let man = clap_mangen::Man::new(sub);
        man.render_name_section(&mut section)?;
        man.render_synopsis_section(&mut section)?;
        man.render_description_section(&mut section)?;
        man.render_options_section(&mut section)?;
        // Each subcommand's sections, demoted under a heading of its own.
        let section = String::from_utf8_lossy(&section).replace(".SH ", ".SS ");
        page.extend_from_slice(section.as_bytes());
    }
    page.extend_from_slice(examples().as_bytes());
    page.extend_from_slice(environment(command).as_bytes());
    Ok(page)
}

/// `text` safe in roff: backslashes and hyphens escaped, no line starting with a control
/// character.
fn roff(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

fn examples() -> String {
    let mut text = String::from(".SH EXAMPLES\n");
    for (what, line) in EXAMPLES {
        text.push_str(&format!(
            ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
            roff(what),
            roff(line)
        ));
    }
    text
}

/// Every variable a flag reads (with the flag's help), then [`OTHER_VARIABLES`].
fn environment(command: &clap::Command) -> String {
    let mut variables = BTreeMap::new();
    collect(command, &mut variables);
    let mut text =
        String::from(".SH ENVIRONMENT\nEach flag's variable; a flag on the command line wins.\n");
    for (name, help) in variables
        .iter()
        .map(|(n, h)| (n.as_str(), h.as_str()))
        .chain(OTHER_VARIABLES.iter().map(|(name, help)| (*name, *help)))
    {
        text.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(name), roff(help)));
    }
    text
}

fn collect(command: &clap::Command, variables: &mut BTreeMap<String, String>) {
    for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
        let Some(variable) = arg.get_env() else {
            continue;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let help = help.trim_end_matches('.');
        let flag = arg
            .get_long()
            .map(|long| format!("--{long}"))
            .unwrap_or_default();
        variables
            .entry(variable.to_string_lossy().into_owned())
            .or_insert_with(|| format!("{flag}: {help}."));
    }
    for sub in command.get_subcommands() {
        collect(sub, variables);
    }
}
