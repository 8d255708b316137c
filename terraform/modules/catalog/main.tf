# Terraform fills unset optional attributes with null, but the schema reads an absent
# key differently from null (a type without "zones" is offered in every zone of its
# region), so optional keys are dropped when unset. spot_price is the exception: null
# is its documented "no spot offered".
locals {
  catalog = {
    version      = 1
    generated_by = var.generated_by
    clouds = [
      for cloud in var.clouds : merge(
        { name = cloud.name },
        cloud.project == null ? {} : { project = cloud.project },
        {
          regions = [
            for region in cloud.regions : merge(
              { name = region.name },
              region.edge_url == null ? {} : { edge_url = region.edge_url },
              region.artifact_bucket == null ? {} : { artifact_bucket = region.artifact_bucket },
              {
                template = { for key, value in region.template : key => value if value != null }
                zones    = [for zone in region.zones : { for key, value in zone : key => value if value != null }]
                instance_types = [
                  for it in region.instance_types : merge(
                    { for key, value in it : key => value if value != null },
                    { spot_price = it.spot_price },
                  )
                ]
              },
            )
          ]
        },
      )
    ]
  }
}
