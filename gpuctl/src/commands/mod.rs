//! One module per subcommand that talks to the controller. Each asks the controller for
//! what it shows (no more), and returns a typed view: the view serialises as the
//! command's `--json` output and renders one way as text ([`View`]).

pub mod admin;
pub mod cancel;
pub mod controllers;
pub mod efficiency;
pub mod explain;
pub mod history;
pub mod hold;
pub mod interactive;
pub mod join;
pub mod node;
pub mod nodes;
pub mod partitions;
pub mod priority;
pub mod queue;
pub mod report;
pub mod run;
pub mod share;
pub mod show;
pub mod submit;
pub mod top;
pub mod update;
pub mod whoami;
pub mod windows;

use crate::cli::{print, print_json_streamed};

/// What a command shows.
pub trait View: serde::Serialize {
    /// The text form (tables, or a line).
    fn text(&self) -> String;
}

/// Prints `view` as JSON or as text.
pub fn emit(view: &impl View, json: bool) {
    if json {
        print_json_streamed(view);
    } else {
        print(&view.text());
    }
}
