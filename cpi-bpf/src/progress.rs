//! The library's progress stages (cpi-user/src/progress.rs) drawn as an indicatif bar on
//! standard error, when it is a terminal and `-q` was not given; warnings printed while a
//! bar is shown go above it ([`Stderr`]).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use cpi_user::progress::{self, Reporter, Unit};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar being shown, if any.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

struct Bar;

impl Reporter for Bar {
    fn begin(&self, what: &str, total: Option<u64>, unit: Unit) {
        let (done, all, noun) = match unit {
            Unit::Bytes => ("{bytes}", "{total_bytes}", String::new()),
            Unit::Count(n) => ("{human_pos}", "{human_len}", format!(" {n}")),
        };
        // `wide_bar` takes what the terminal's width leaves, so the line never wraps.
        let template = match total {
            Some(_) => format!("cpi-bpf: {{msg}} [{{wide_bar}}] {done}/{all}{noun} {{eta}}"),
            None => format!("cpi-bpf: {{msg}} {{spinner}} {done}{noun}, {{elapsed}}"),
        };
        let style = ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr())
            .with_style(style)
            .with_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        if let Some(old) = lock().replace(bar) {
            old.finish_and_clear();
        }
    }

    fn update(&self, done: u64) {
        if let Some(b) = lock().as_ref() {
            b.set_position(done);
        }
    }

    fn end(&self) {
        if let Some(b) = lock().take() {
            b.finish_and_clear();
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<ProgressBar>> {
    BAR.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Shows progress on standard error when it is a terminal, unless `quiet`.
pub fn install(quiet: bool) {
    if !quiet && std::io::stderr().is_terminal() {
        progress::install(Box::new(Bar));
    }
}

/// Standard error for messages: written above a bar that is being shown.
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match lock().as_ref() {
            Some(b) => b
                .suspend(|| std::io::stderr().write_all(buf))
                .map(|()| buf.len()),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
