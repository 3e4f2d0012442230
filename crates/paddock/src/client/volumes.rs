//! `paddock volume create | ls | get | rm`.

use std::process::ExitCode;

use paddock_types::api::{CreateVolumeRequest, ListVolumesQuery, VolumeInfo, VolumeList};
use paddock_types::ByteSize;
use reqwest::Method;

use super::{print_json, ApiClient, Table};

const PAGE: u32 = 500;

pub async fn create(
    client: &ApiClient,
    name: String,
    size: Option<ByteSize>,
    labels: Vec<(String, String)>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let request = CreateVolumeRequest {
        name,
        size,
        labels: labels.into_iter().collect(),
    };
    let info: VolumeInfo = client
        .json(client.request(Method::POST, &["v1", "volumes"]).json(&request))
        .await?;
    if json {
        print_json(&info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn list(client: &ApiClient, json: bool) -> anyhow::Result<ExitCode> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let query = ListVolumesQuery {
            limit: Some(PAGE),
            cursor: cursor.take(),
        };
        let page: VolumeList = client
            .json(client.request(Method::GET, &["v1", "volumes"]).query(&query))
            .await?;
        all.extend(page.volumes);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if json {
        return print_json(&VolumeList {
            volumes: all,
            next_cursor: None,
        })
        .map(|()| ExitCode::SUCCESS);
    }
    let mut table = Table::new(["ID", "NAME", "USED", "SIZE", "MOUNTED BY", "CREATED"]);
    for v in &all {
        table.row([
            v.id.clone(),
            v.name.clone(),
            bytes(v.used_bytes),
            bytes(v.size_bytes),
            v.mounted_by.len().to_string(),
            v.created_at.clone(),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

pub async fn get(client: &ApiClient, volume: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: VolumeInfo = client
        .json(client.request(Method::GET, &["v1", "volumes", volume]))
        .await?;
    if json {
        print_json(&info)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("id:         {}", info.id);
    println!("name:       {}", info.name);
    println!("used:       {}", bytes(info.used_bytes));
    println!("size:       {}", bytes(info.size_bytes));
    println!("created:    {}", info.created_at);
    let mounted = if info.mounted_by.is_empty() {
        "-".to_owned()
    } else {
        info.mounted_by.join(", ")
    };
    println!("mounted by: {mounted}");
    for (k, v) in &info.labels {
        println!("label:      {k}={v}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn remove(client: &ApiClient, volumes: &[String]) -> anyhow::Result<ExitCode> {
    for volume in volumes {
        client
            .send(client.request(Method::DELETE, &["v1", "volumes", volume]))
            .await?;
        println!("{volume}");
    }
    Ok(ExitCode::SUCCESS)
}

fn bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "-".to_owned(), |b| ByteSize::bytes(b).to_string())
}
