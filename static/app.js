// Behaviour the dashboard's markup asks for with data attributes, so that no page needs inline script
// (the Content-Security-Policy forbids it).
document.addEventListener("change", function (event) {
  var field = event.target;
  if (field instanceof HTMLSelectElement && field.hasAttribute("data-submit-on-change") && field.form) {
    if (field.form.requestSubmit) {
      field.form.requestSubmit();
    } else {
      field.form.submit();
    }
  }
});
