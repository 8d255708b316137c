# Every credential is generated here and handed to the services only through Secret
# Manager, as the NIMBUS_* variables controlplane/config.py and the edge read. The
# values also live in the Terraform state, which must be stored encrypted.

# Letters and digits only: the values are embedded in URLs.
resource "random_password" "this" {
  for_each = toset(["database", "admin-token", "edge-token", "session-secret"])

  length  = 48
  special = false
}

locals {
  # Memorystore's TLS certificate is signed by a per-instance CA; the entrypoint
  # writes NIMBUS_REDIS_CA_PEM to this path before the process starts.
  redis_ca_path = "/tmp/redis-ca.pem"
  redis_base    = "rediss://:${google_redis_instance.this.auth_string}@${google_redis_instance.this.host}:${google_redis_instance.this.port}"

  # Secret name => value. Names are static so they can key for_each; values are not.
  secret_names = toset(["database-url", "broker-url", "redis-url", "admin-token", "edge-token", "session-secret"])
  secret_values = {
    database-url   = "postgresql+psycopg://${google_sql_user.nimbus.name}:${random_password.this["database"].result}@${google_sql_database_instance.this.private_ip_address}:5432/${google_sql_database.nimbus.name}?sslmode=require"
    broker-url     = "${local.redis_base}/1?ssl_cert_reqs=required&ssl_ca_certs=${local.redis_ca_path}"
    redis-url      = "${local.redis_base}/0?ssl_ca_certs=${local.redis_ca_path}"
    admin-token    = random_password.this["admin-token"].result
    edge-token     = random_password.this["edge-token"].result
    session-secret = random_password.this["session-secret"].result
  }
  secret_ids = { for key, secret in google_secret_manager_secret.this : key => secret.secret_id }
}

resource "google_secret_manager_secret" "this" {
  for_each = local.secret_names

  project   = var.project_id
  secret_id = "${var.name}-${each.key}"
  labels    = var.labels

  replication {
    user_managed {
      replicas {
        location = var.region
        customer_managed_encryption {
          kms_key_name = var.kms_key_id
        }
      }
    }
  }
}

resource "google_secret_manager_secret_version" "this" {
  for_each = local.secret_names

  secret      = google_secret_manager_secret.this[each.key].id
  secret_data = local.secret_values[each.key]
}

resource "google_sql_database_instance" "this" {
  #checkov:skip=CKV_GCP_6:ssl_mode ENCRYPTED_ONLY refuses every unencrypted connection; clients authenticate with a Secret Manager password over private IP, not with client certificates.
  #checkov:skip=CKV_GCP_79:The major version is an input pinned to the release the migrations are tested against; major upgrades are deliberate.
  #checkov:skip=CKV2_GCP_13:log_duration writes one line per statement of a busy API; slow statements are captured by Query Insights instead.
  project             = var.project_id
  name                = "${var.name}-postgres"
  region              = var.region
  database_version    = var.database_version
  encryption_key_name = var.kms_key_id
  deletion_protection = var.deletion_protection

  settings {
    tier              = var.database_tier
    edition           = "ENTERPRISE"
    availability_type = "REGIONAL"
    disk_type         = "PD_SSD"
    disk_autoresize   = true
    user_labels       = var.labels

    ip_configuration {
      ipv4_enabled                                  = false
      private_network                               = var.network.network_id
      ssl_mode                                      = "ENCRYPTED_ONLY"
      enable_private_path_for_google_cloud_services = true
    }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
      transaction_log_retention_days = 7
      backup_retention_settings {
        retained_backups = 14
      }
    }

    insights_config {
      query_insights_enabled  = true
      record_application_tags = true
      record_client_address   = false
    }

    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_min_messages"
      value = "error"
    }
    database_flags {
      name  = "log_temp_files"
      value = "0"
    }
    database_flags {
      name  = "log_min_duration_statement"
      value = "-1"
    }
    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }
    database_flags {
      name  = "log_hostname"
      value = "on"
    }
    database_flags {
      name  = "log_statement"
      value = "ddl"
    }
    database_flags {
      name  = "cloudsql.enable_pgaudit"
      value = "on"
    }
  }
}

resource "google_sql_database" "nimbus" {
  project  = var.project_id
  instance = google_sql_database_instance.this.name
  name     = "nimbus"
}

resource "google_sql_user" "nimbus" {
  project  = var.project_id
  instance = google_sql_database_instance.this.name
  name     = "nimbus"
  password = random_password.this["database"].result
}

resource "google_redis_instance" "this" {
  project            = var.project_id
  name               = "${var.name}-redis"
  region             = var.region
  tier               = "STANDARD_HA"
  memory_size_gb     = var.redis_memory_size_gb
  redis_version      = "REDIS_7_2"
  authorized_network = var.network.network_id
  connect_mode       = "PRIVATE_SERVICE_ACCESS"
  labels             = var.labels

  auth_enabled            = true
  transit_encryption_mode = "SERVER_AUTHENTICATION"
  customer_managed_key    = var.kms_key_id

  persistence_config {
    persistence_mode    = "RDB"
    rdb_snapshot_period = "ONE_HOUR"
  }
}
