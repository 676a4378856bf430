//! `vvm run --hold`: the slot or the units held with no command, as `etcdctl lock NAME` holds a
//! lock — so that a shell script can hold them around several commands of its own. The token is
//! printed once, on one line of standard output, when held; the hold lasts until SIGINT,
//! SIGTERM or SIGHUP (or until it is lost: `vvm` then exits non-zero, or is ended by its killer
//! at the kill deadline, exit 75).

use std::io::Write;

use vvm::{Service, ServiceContext, ServiceError};

/// Holds what `vvm run` acquired and prints its token; nothing else runs.
pub(super) struct HoldService;

impl Service for HoldService {
    fn name(&self) -> std::borrow::Cow<'static, str> {
        "hold".into()
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let Some(token) = context.token() else {
            return Err(ServiceError::new("no valid fencing token at start"));
        };
        context.ready();
        // The command's variables, in a form a script can `read` or `eval`; written once and
        // flushed, so that the reader of a pipe sees it at once. A closed standard output does
        // not end the hold: the signal does.
        print_token(token);
        context.shutdown().requested().await;
        Ok(())
    }
}

/// One line, flushed; errors ignored (see above).
fn print_token(token: vvm::FencingToken) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(
        stdout,
        "VVM_SLOT={} VVM_FENCING_TOKEN={token}",
        token.slot.0
    )
    .and_then(|()| stdout.flush());
}
