//! `gpuctl whoami`: who the controller takes the caller for.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};

#[derive(Serialize)]
pub struct WhoAmI {
    admin: bool,
    pub(crate) user: String,
    via: String,
}

impl View for WhoAmI {
    fn text(&self) -> String {
        format!(
            "{}{} (via {})\n",
            self.user,
            if self.admin { ", admin" } else { "" },
            self.via
        )
    }
}

pub async fn run(client: &mut Client) -> Result<WhoAmI, Failure> {
    let me = client.who_am_i(pb::WhoAmIRequest {}).await?.into_inner();
    Ok(WhoAmI {
        admin: me.admin,
        user: me.user,
        via: me.via,
    })
}
