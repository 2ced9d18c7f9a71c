//! `gpuctl efficiency JOB` (like `seff`, GPU-aware): what the job asked for against what
//! it used, and the job-file lines to use next time (`gpuctl_core::efficiency`).

use gpuctl_core::efficiency::{self, Efficiency};
use gpuctl_proto as pb;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

impl View for Efficiency {
    fn text(&self) -> String {
        let mut text = format!(
            "Job {} ({}), ran {} of its {} limit; {} GPU sample(s) over {} GPU(s) or slice(s)\n",
            self.job_id,
            self.state,
            humantime::format_duration(std::time::Duration::from_secs(self.elapsed_secs)),
            humantime::format_duration(std::time::Duration::from_secs(self.time_limit_secs)),
            self.gpu_samples,
            self.gpu_slots,
        );
        let rows = self
            .rows
            .iter()
            .map(|r| vec![r.what.clone(), r.requested.clone(), r.used.clone()])
            .collect();
        text.push_str(&format::table(&["", "REQUESTED", "USED"], rows));
        if let Some(busy) = self.steps_busy {
            text.push_str(&format!(
                "\nSteps: {}, at least one running {:.0}% of the job's time\n",
                self.steps.len(),
                busy * 100.0
            ));
            let rows = self
                .steps
                .iter()
                .map(|st| {
                    vec![
                        format!("{}.{}", self.job_id, st.id),
                        st.name.clone(),
                        st.tasks.to_string(),
                        humantime::format_duration(std::time::Duration::from_secs(st.elapsed_secs))
                            .to_string(),
                        st.exit_code.map_or("-".into(), |c| c.to_string()),
                    ]
                })
                .collect();
            text.push_str(&format::table(
                &["STEP", "NAME", "TASKS", "ELAPSED", "EXIT"],
                rows,
            ));
        }
        if self.advice.is_empty() && self.state == "PENDING" {
            text.push_str("\nNo advice yet: it has not run.\n");
        } else if self.advice.is_empty() && self.gpu_samples < 3 && self.cpus_used_mean.is_none() {
            text.push_str(&format!(
                "\nNo advice: too little was measured ({} GPU sample(s), no CPU figures) to tell what it used.\n",
                self.gpu_samples
            ));
        } else if self.advice.is_empty() {
            text.push_str("\nNo advice: it used about what it asked for.\n");
        } else {
            text.push_str(&format!(
                "\nNext time, in the job file ({}% margin over what was used):\n",
                ((efficiency::MARGIN - 1.0) * 100.0).round()
            ));
            for a in &self.advice {
                text.push_str(&format!("  {a}\n"));
            }
        }
        text
    }
}

pub async fn run(client: &mut Client, job_id: u64) -> Result<Efficiency, Failure> {
    let job = client
        .get_job(pb::GetJobRequest { job_id })
        .await?
        .into_inner();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let job = gpuctl_core::record::Job::try_from(job)?;
    Ok(efficiency::report(&job, now))
}
