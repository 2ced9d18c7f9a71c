//! `gpuctl admin token create|list|revoke` and `gpuctl admin reconfigure`.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct Created {
    id: String,
    token: String,
    user: String,
}

impl View for Created {
    fn text(&self) -> String {
        format!(
            "Token {} for {} (shown once; give it to the user, who puts it in ~/.config/gpuctl/token or GPUCTL_TOKEN):\n{}\n",
            self.id, self.user, self.token
        )
    }
}

pub async fn create(client: &mut Client, user: String, note: String) -> Result<Created, Failure> {
    let t = client
        .create_token(pb::CreateTokenRequest { user, note })
        .await?
        .into_inner();
    Ok(Created {
        id: t.id,
        token: t.token,
        user: t.user,
    })
}

#[derive(Serialize)]
pub struct Token {
    created_ms: i64,
    id: String,
    note: String,
    user: String,
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Tokens {
    tokens: Vec<Token>,
}

impl View for Tokens {
    fn text(&self) -> String {
        let mut out = String::from("ID            USER         CREATED               NOTE\n");
        for t in &self.tokens {
            let created = format::time_string(t.created_ms).unwrap_or_default();
            out.push_str(&format!(
                "{:<13} {:<12} {created}  {}\n",
                t.id,
                t.user,
                format::printable(&t.note)
            ));
        }
        out
    }
}

pub async fn list(client: &mut Client) -> Result<Tokens, Failure> {
    let tokens = client
        .list_tokens(pb::ListTokensRequest {})
        .await?
        .into_inner()
        .tokens
        .into_iter()
        .map(|t| Token {
            created_ms: t.created_ms,
            id: t.id,
            note: t.note,
            user: t.user,
        })
        .collect();
    Ok(Tokens { tokens })
}

#[derive(Serialize)]
pub struct Revoked {
    id: String,
}

impl View for Revoked {
    fn text(&self) -> String {
        format!("Token {} revoked\n", self.id)
    }
}

pub async fn revoke(client: &mut Client, id: String) -> Result<Revoked, Failure> {
    client
        .revoke_token(pb::RevokeTokenRequest { id: id.clone() })
        .await?;
    Ok(Revoked { id })
}

/// `gpuctl admin reconfigure`: what the controller took from its configuration file.
#[derive(Serialize)]
pub struct Reconfigured {
    path: String,
    applied: Vec<String>,
    needs_restart: Vec<String>,
}

impl View for Reconfigured {
    fn text(&self) -> String {
        let mut out = format!("Read {} again.\n", self.path);
        if self.applied.is_empty() && self.needs_restart.is_empty() {
            out.push_str("Nothing changed.\n");
        }
        if !self.applied.is_empty() {
            out.push_str(&format!("Applied: {}\n", self.applied.join(", ")));
        }
        if !self.needs_restart.is_empty() {
            out.push_str(&format!(
                "Changed but kept until gpuctld restarts: {}\n",
                self.needs_restart.join(", ")
            ));
        }
        out
    }
}

pub async fn reconfigure(client: &mut Client) -> Result<Reconfigured, Failure> {
    let r = client
        .reconfigure(pb::ReconfigureRequest {})
        .await?
        .into_inner();
    Ok(Reconfigured {
        path: r.path,
        applied: r.applied,
        needs_restart: r.needs_restart,
    })
}
