"""`kubectl hami` and `hami-control status`: what hami-control sees of a cluster, read-only.

- `snapshot`: the cluster as hami-control's own stores hold it (`cache.ClusterCache`, `pod_store.PodStore`,
  `quota_store.QuotaCache`), fed from plain JSON lists, plus the DRA ResourceSlices and claims. Pure.
- `dra`: GPUs of DRA nodes from our driver's ResourceSlices, and what allocated claims consume. Pure.
- `vendors`: which vendor a device is (`nvidia`, or the vendor's family), for the VENDOR column and the
  `vendor` label of hami-control's metrics. Pure.
- `top`, `explain`, `quotas`: the models (`build_*`) and their text, JSON and YAML forms (`render_*`,
  `*_dict`). Pure: plain functions over a snapshot and objects.
- `cli`: the edge: flags, the kubeconfig, one paged list per resource through `hami_kube`, output and exit
  codes (`kubectl-hami` and `hami-control status`).
"""
