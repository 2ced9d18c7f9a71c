//! For the scale bench with TLS (the product's default): a simulated node joins as gpud
//! does, with a single-use token made over the controller's socket, a certificate
//! request for a fresh key sent over a connection verified under the cluster CA, and
//! from then on dials with its own certificate (one connection per node, as real
//! agents have).

use gpuctl_proto::agent_link_client::AgentLinkClient;
use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::controller_client::ControllerClient;
use gpuctl_proto::tls::{ClientTls, NodeIdentity, NodeRequest};
use gpuctl_proto::{self as pb};
use tonic::transport::{Channel, Endpoint};

/// What a joined node signs and dials with.
pub struct Joined {
    pub key: ClusterKey,
    /// Presents the node's certificate; connects when first used.
    pub channel: Channel,
}

/// Joins `node` to the controller at `url` (`https://...`) whose CA is `ca_pem`;
/// `admin` is a client on its Unix socket (root: an admin).
pub async fn join(
    admin: &mut ControllerClient<Channel>,
    ca_pem: &str,
    url: &str,
    node: &str,
) -> Joined {
    let token = admin
        .create_join_token(pb::CreateJoinTokenRequest {
            ttl_seconds: 3600,
            node: node.to_string(),
        })
        .await
        .expect("a join token")
        .into_inner()
        .token;
    let req = NodeRequest::new(node).expect("a certificate request");
    let endpoint = Endpoint::from_shared(url.to_string()).expect("a URL");
    let anonymous = ClientTls::new(ca_pem, None)
        .expect("the CA")
        .connect(endpoint.clone())
        .await
        .expect("a TLS connection to join over");
    let answer = AgentLinkClient::new(anonymous)
        .join(pb::JoinRequest {
            token,
            node: node.to_string(),
            csr: req.csr_der,
        })
        .await
        .expect("joined")
        .into_inner();
    let key = ClusterKey::from_hex(&answer.node_key).expect("a node key");
    let identity =
        NodeIdentity::from_pem(&answer.certificate, &req.key_pem).expect("a node identity");
    let channel = ClientTls::new(ca_pem, Some(identity))
        .expect("the CA")
        .channel(endpoint);
    Joined { key, channel }
}
